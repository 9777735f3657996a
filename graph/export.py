"""The schedule a session found, as the user's next training run (``schedule.yaml``, ``mart export --schedule``).

A schedule is a list of segments ``(from_step, to_step, overrides)``: ``overrides`` is the segment's full set
of changes against the session's base config (``fixed`` holds the ``--set`` values and stage 1's system
config, the same in every segment). To train it with verl, launch one run per segment, each resuming from the
checkpoint the previous one saved at its last step: the ``verl`` part lists each launch's overrides, which is
what mart's verl backend does for a branch (``trainer.resume_mode=resume_path``, ``resume_from_path`` the
previous segment's ``global_step_N``, model and optimizer restored, the data position and global step with
them; see docs/backends.md).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import yaml

from mart.state.config_values import format_value
from mart.state.text import one_line

DEFAULT_CHECKPOINT_DIR = "checkpoints/mart-schedule"
VERL_COMMAND = "python3 -m verl.trainer.main_ppo"


def _override(key: str, value: Any) -> str:
    try:  # verl's own rule (a "+" for a key its config lacks); a key outside verl's config is written as is
        from mart.trial_runner.verl.overrides import override

        return override(key, value)
    except Exception:  # noqa: BLE001 - the plain Hydra form is still what a user would type
        return f"{key}={format_value(value)}"


def segment_launches(segments: list[dict[str, Any]], fixed: dict[str, Any],
                     checkpoint_dir: str = DEFAULT_CHECKPOINT_DIR) -> list[list[str]]:
    """verl overrides of each segment's launch: its knobs, its last step, a save there, and (after the first)
    the resume from the previous segment's checkpoint."""
    out = []
    for i, seg in enumerate(segments):
        cfg = {**fixed, **seg["overrides"]}
        args = [_override(k, v) for k, v in sorted(cfg.items())]
        args += [f"trainer.total_training_steps={seg['to_step']}", f"trainer.save_freq={seg['to_step']}",
                 f"trainer.default_local_dir={checkpoint_dir}"]
        if i == 0:
            args.append("trainer.resume_mode=disable")
        else:
            args += ["trainer.resume_mode=resume_path",
                     f"trainer.resume_from_path={checkpoint_dir}/global_step_{seg['from_step']}",
                     # the lr scheduler and RNG ('extra') would bring back the previous segment's lr
                     "actor_rollout_ref.actor.checkpoint.load_contents=[model,optimizer]"]
        out.append(args)
    return out


def _check_segments(segments: Any) -> None:
    """The stored segments are foreign text (a run folder): their bounds must be step numbers, their overrides
    a mapping, before any of it reaches a script. Raises ValueError naming the field and the rule."""
    if not isinstance(segments, list):
        raise ValueError("schedule.segments: must be a list of segments")
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict):
            raise ValueError(f"schedule.segments[{i}]: must be a mapping")
        for key in ("from_step", "to_step"):
            v = seg.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"schedule.segments[{i}].{key}: must be a step number (an integer >= 0), "
                                 f"got {one_line(repr(v))[:80]}")
        if not isinstance(seg.get("overrides"), dict):
            raise ValueError(f"schedule.segments[{i}].overrides: must be a mapping of KEY: VALUE")


def schedule_document(summary: dict[str, Any], options: dict[str, Any],
                      checkpoint_dir: str = DEFAULT_CHECKPOINT_DIR) -> dict[str, Any]:
    """The exported schedule of a completed session's summary (raises ValueError when there is none, or when
    its stored fields are not what a schedule holds)."""
    sched = summary.get("schedule") or {}
    segments = sched.get("segments") or []
    if not segments:
        raise ValueError(f"run {one_line(summary.get('run_id'))} has no schedule (run `mart tune --stages "
                         "...,schedule`; a schedule stage that reached no complete path has none)")
    _check_segments(segments)
    fixed = {**(options.get("start_overrides") or {}), **((summary.get("system") or {}).get("best_config") or {})}
    launches = segment_launches(segments, fixed, checkpoint_dir)
    return {
        "run_id": summary.get("run_id"),
        "total_steps": segments[-1]["to_step"],
        "final_score": sched.get("final_score"),
        "static_best_score": sched.get("static_best_score"),
        "gain": sched.get("gain"),
        "gpu_hours": sched.get("gpu_hours"),
        "static_gpu_hours": sched.get("static_gpu_hours"),
        "fixed": fixed,
        "segments": [{"from_step": s["from_step"], "to_step": s["to_step"], "overrides": s["overrides"],
                      "changes": s.get("changes", {})} for s in segments],
        "verl": {"checkpoint_dir": checkpoint_dir,
                 "launches": [{"steps": [s["from_step"], s["to_step"]], "overrides": a}
                              for s, a in zip(segments, launches)]},
    }


def final_config(summary: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The session's final config against the backend's base: the ``--set`` values, stage 1's best system
    overrides and stage 2's best learning overrides."""
    return {**(options.get("start_overrides") or {}), **((summary.get("system") or {}).get("best_config") or {}),
            **((summary.get("learning") or {}).get("best_config") or {})}


def config_script(summary: dict[str, Any], options: dict[str, Any]) -> str:
    """The final config as one verl launch (bash): the overrides mart found after the user's own base overrides
    (``bash final.sh data.train_files=... ...``), so a later value on the command line wins as Hydra reads it."""
    config = final_config(summary, options)
    lines = ["#!/usr/bin/env bash", f"# mart final config of run {summary.get('run_id')}: the verl overrides it found",
             "# (--set values, stage 1's system knobs, stage 2's learning knobs). Your base overrides: \"$@\".",
             "set -euo pipefail", f'VERL="${{VERL_CMD:-{VERL_COMMAND}}}"']
    args = [shlex.quote(_override(k, v)) for k, v in sorted(config.items())]
    lines.append('$VERL "$@"' + "".join(f" \\\n  {a}" for a in args))
    return "\n".join(lines) + "\n"


def render(doc: dict[str, Any], fmt: str = "yaml") -> str:
    """``yaml`` (the file), ``json``, or ``sh``: a bash script running the verl launches in order, with the
    user's own base overrides passed as its arguments (``bash schedule.sh data.train_files=... ...``)."""
    if fmt == "yaml":
        head = ("# mart schedule: per-segment overrides against the base config (`fixed` is the same in every\n"
                "# segment); verl.launches: one verl run per segment, each resuming from the previous checkpoint\n")
        return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "sh":
        # every stored field reaches the script quoted (arguments) or on one comment line (no newline, no control)
        lines = ["#!/usr/bin/env bash", f"# mart schedule of run {one_line(doc.get('run_id'))}: one verl launch per segment,",
                 "# each resuming from the checkpoint the previous one saved. Your base overrides: \"$@\".",
                 "set -euo pipefail", f'VERL="${{VERL_CMD:-{VERL_COMMAND}}}"']
        for launch in doc["verl"]["launches"]:
            a, b = launch["steps"]
            lines.append(f"# steps {int(a)}-{int(b)}")
            lines.append('$VERL "$@" ' + " ".join(shlex.quote(x) for x in launch["overrides"]))
        return "\n".join(lines) + "\n"
    raise ValueError(f"schedule format must be yaml, json or sh, got {fmt!r}")
