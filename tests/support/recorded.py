"""Recorded sessions: the fingerprint of a whole session (its trials, reviews, health events and summary), so a
refactoring of the graph can be checked to change nothing a user sees (``tests/graph/test_replay.py``).

The fingerprints in ``tests/data/recorded/*.json`` were first written by this module on the code before the stage
protocol (issue 21) and parallel trials (issue 22), which changed none of them; the sim ones were re-recorded
since for intended changes only (issue 23's job model, issue 24's dynamics, the stage-2 verdict's wording, the
simulator's stage-1 trials running without validation as verl's runner runs them). With
``parallel=1`` every session must produce them exactly. Regenerate one only when a behaviour change is intended, and say why in the commit:

    python -m tests.support.recorded --write NAME    # or --write all
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from mart.state.ledger import Ledger

DATA = Path(__file__).resolve().parents[1] / "data" / "recorded"
TOY = "tests.support.toy_backend:make_backend"

_TOY = dict(backend=TOY, approve="auto", system_trials=4, learning_trials=3, system_horizon=5, learning_horizon=6,
            watch_interval_s=0.01, quiet=True, report=False)
_SIM = dict(backend="sim", approve="auto", system_trials=6, learning_trials=4, system_horizon=6,
            learning_horizon=20, watch_interval_s=0.001, quiet=True, report=False)

#: name -> TuneOptions fields (runs_dir added at run time); each is deterministic on its backend's clock
SESSIONS: dict[str, dict[str, Any]] = {
    "toy-default": dict(_TOY),
    "toy-seed3": dict(_TOY, seed=3, system_trials=6, learning_trials=5),
    # the health monitor sees every step (a watch pass per step): its findings do not depend on machine load
    "toy-stream-early-stop": dict(_TOY, backend_options={"stream": True}, learning_trials=5, learning_horizon=8,
                                  watch_interval_s=1e-6,
                                  _answers={"learning": [
                                      {"action": "edit", "edits": {"actor_rollout_ref.actor.optim.lr": 0.05}},
                                      {"action": "reject", "feedback": "smaller learning rate please"},
                                      {"action": "edit", "edits": {"actor_rollout_ref.actor.entropy_coeff": 0.04}}]}),
    "toy-reviews": dict(_TOY, _answers={"system": [
        {"action": "reject", "feedback": "use less memory"},
        {"action": "edit", "edits": {"actor_rollout_ref.rollout.max_num_seqs": 64}},
        {"action": "approve"}, {"action": "reject", "feedback": "no gradient checkpointing changes"}]}),
    "toy-schedule-less": dict(_TOY, stages=["system"], system_trials=5),
    "sim-0.6b": dict(_SIM, backend_options={"scenario": "qwen3-0.6b-1x8", "clock": "poll", "seed": 0}),
    "sim-8b-seed2": dict(_SIM, seed=2, backend_options={"scenario": "qwen3-8b-1x8", "clock": "poll", "seed": 2}),
    "sim-schedule": dict(_SIM, stages=["system", "learning", "schedule"], system_trials=4, learning_trials=3,
                         learning_horizon=18, schedule_segments=3, schedule_branches=2,
                         backend_options={"scenario": "qwen3-0.6b-1x8", "clock": "poll", "seed": 1}),
    "sim-debate": dict(_SIM, system_trials=4, learning_trials=3,
                       backend_options={"scenario": "qwen2.5-3b-debate-2x2", "clock": "poll", "seed": 0}),
}

try:  # the local CPU workload: stage 2 alone (its scores are deterministic per seed; stage 1 is timed)
    from mart.trial_runner.local.config import TINY_CONFIG

    SESSIONS["local-learning"] = dict(backend="local", approve="auto", stages=["learning"], learning_trials=3,
                                      learning_horizon=6, learning_confirm_trials=1, start_overrides=dict(TINY_CONFIG),
                                      watch_interval_s=0.05, quiet=True, report=False,
                                      _ignore=["peak_memory_gb", "best_peak_memory_gb"])  # measured RSS
except ImportError:  # pragma: no cover - the local backend is part of mart
    pass


def _r(v: Any) -> Any:
    if isinstance(v, float):
        return None if math.isnan(v) else float(f"{v:.9g}")
    if isinstance(v, dict):
        return {k: _r(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_r(x) for x in v]
    return v


# summary parts that depend on the machine or the clock, not on the session's decisions
_VOLATILE = ("run_id", "report", "run_dir", "schedule_file")


def _drop(v: Any, keys: tuple[str, ...]) -> Any:
    if isinstance(v, dict):
        return {k: _drop(x, keys) for k, x in v.items() if k not in keys}
    if isinstance(v, list):
        return [_drop(x, keys) for x in v]
    return v


def fingerprint(run_dir: str | Path, summary: dict[str, Any], ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a user sees of a finished session, without wall times, paths and ids of the run (and without the
    ``ignore`` keys: figures a backend measures rather than computes)."""
    ledger = Ledger.open(run_dir)
    try:
        trials = [{k: _r(t.get(k)) for k in (
            "trial_id", "stage", "kind", "candidate_id", "overrides", "status", "reason", "steps_done", "horizon",
            "throughput", "peak_memory_gb", "score", "early_stopped", "parent_trial", "parent_step", "seed",
            "confirms")} for t in ledger.trials()]
        reviews = [{k: r[k] for k in ("review_id", "candidate_id", "action", "feedback")}
                   for r in sorted(ledger.table_rows("reviews"), key=lambda r: r["review_id"])]
        events = sorted(f"{e.trial_id}:{e.scoped_rule}:{e.step}:{e.severity}" for e in ledger.health_events())
        proposals = sorted(f"{r['candidate_id']}={r['overrides']}" for r in ledger.table_rows("proposals"))
    finally:
        ledger.close()
    summ = {k: _r(v) for k, v in summary.items() if k not in _VOLATILE}
    if isinstance(summ.get("agents"), dict):
        summ["agents"] = {k: v for k, v in summ["agents"].items() if k in ("calls", "trials_by_source")}
    return _drop({"trials": trials, "reviews": reviews, "health_events": events, "proposals": proposals,
                  "summary": summ}, tuple(ignore))


def _reviewer(plans: dict[str, list[dict[str, Any]]] | None):
    """Answers each review with the next planned decision of its stage, approves where none is planned."""
    from mart.graph.reviewers.base import Reviewer
    from mart.state.models import ReviewDecision

    if not plans:
        return None
    plans = {stage: list(answers) for stage, answers in plans.items()}

    class Planned(Reviewer):
        name = "planned"

        def review(self, request):
            plan = plans.get(request["stage"])
            answer = plan.pop(0) if plan else {"action": "approve"}
            return ReviewDecision(**answer, reviewer="test", channel="test")

    return Planned()


def run_session(name: str, runs_dir: str | Path, **extra: Any) -> dict[str, Any]:
    from mart.graph.session import tune
    from mart.state.options import TuneOptions

    fields = dict(SESSIONS[name])
    answers = fields.pop("_answers", None)
    ignore = tuple(fields.pop("_ignore", ()))
    opts = TuneOptions(**{**fields, "runs_dir": str(runs_dir), **extra})
    summary = tune(opts, reviewer=_reviewer(answers))
    return fingerprint(Path(runs_dir) / summary["run_id"], summary, ignore)


def load(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", nargs="+", required=True, metavar="NAME", help=f"sessions to record, or all: {list(SESSIONS)}")
    args = p.parse_args(argv)
    names = list(SESSIONS) if args.write == ["all"] else args.write
    DATA.mkdir(parents=True, exist_ok=True)
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            fp = run_session(name, tmp)
        (DATA / f"{name}.json").write_text(json.dumps(fp, indent=1, sort_keys=True) + "\n")
        print(f"{name}: {len(fp['trials'])} trials", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
