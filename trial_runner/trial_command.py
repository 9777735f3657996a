"""``mart trial``: run one trial of any backend in the foreground and show its progress.

Generic over backends: it only uses ``Backend.base_config / validate_config / make_runner`` and the
trial-directory contract. Bad input (an unknown backend, a malformed ``--set``, an unreadable config
file, a config the backend rejects, an occupied ``--out``) prints a clear error, returns 2 and
starts nothing. Ctrl-C stops the trial (SIGTERM, grace, SIGKILL) and leaves a ``stopped`` status.
"""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path
from typing import Any

from mart.state.config_values import load_config_file, parse_assignments
from mart.state.metrics import COMPARED_THROUGHPUT_KEY, THROUGHPUT_KEY
from mart.state.models import TrialStatus
from mart.state.search_space import ConfigError
from mart.state.trials import METRICS_FILE, STATUS_FILE, TrialSpec

EXIT_CODES = {TrialStatus.COMPLETED: 0, TrialStatus.FAILED: 1, TrialStatus.OOM: 3, TrialStatus.STOPPED: 4}
"""Exit code of ``mart trial`` per final status (the local worker's codes); 2 = bad input, no trial."""
EXIT_BAD_INPUT = 2

class InputError(ValueError):
    """The command line or a config file cannot be used."""


def parse_sets(sets: list[str]) -> dict[str, Any]:
    """``--set`` items by the one KEY=VALUE reader (``mart.state.config_values``, docs/configs.md)."""
    try:
        return parse_assignments(sets)
    except ConfigError as e:
        raise InputError(f"--set: {e}") from None


def read_config_file(path: Path) -> dict[str, Any]:
    """A YAML or JSON file of overrides (a mapping, nested or flat, or a list of KEY=VALUE), flattened."""
    try:
        return load_config_file(path)
    except ConfigError as e:
        raise InputError(str(e)) from None


def prepare(backend: Any, steps: int, out: Path, sets: list[str], config_file: Path | None, seed: int,
            memory_capacity_gb: float | None = None, stage: str | None = None) -> TrialSpec:
    """The validated trial spec, or ``InputError`` naming what is wrong (nothing is created)."""
    overrides: dict[str, Any] = {}
    if config_file is not None:
        overrides.update(read_config_file(Path(config_file)))
    overrides.update(parse_sets(sets))
    space = backend.search_space()
    errors = []
    for key, value in overrides.items():
        if key in space:  # the catalogue's ranges hold here as they do for `mart tune`'s candidates
            try:
                overrides[key] = space[key].validate(value)
            except ConfigError as e:
                errors.append(str(e))
    if errors:
        raise InputError("invalid config:\n  " + "\n  ".join(errors))
    extra = {k: v for k, v in overrides.items() if k not in space}
    if extra and hasattr(backend, "extend_base"):
        # keys outside the catalogue are base-config values (e.g. verl's trainer.test_freq): the backend
        # passes them on as the user's own, instead of refusing them as unknown knobs
        try:
            backend.extend_base(extra)
        except ConfigError as e:
            raise InputError(str(e)) from None
    config = dict(backend.base_config())
    config.update(overrides)
    if "seed" in overrides:  # an explicit seed key wins over --seed
        try:
            seed = int(overrides["seed"])
        except (TypeError, ValueError):
            pass  # the backend's validation names the bad value
    if "seed" in config:
        config["seed"] = seed
    if "trainer.total_training_steps" in config:
        config["trainer.total_training_steps"] = steps
    errors = backend.validate_config(config)
    if errors:
        raise InputError("invalid config:\n  " + "\n  ".join(errors))
    out = Path(out)
    if (out / METRICS_FILE).exists() or (out / STATUS_FILE).exists():
        raise InputError(f"{out} already holds a trial ({METRICS_FILE}/{STATUS_FILE}); choose a new --out.")
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} exists and is not a directory.")
    if stage not in (None, "system", "learning"):
        raise InputError(f"--stage must be system or learning, but got {stage!r}.")
    return TrialSpec(trial_id=out.resolve().name or "trial", config=config, steps=steps, stage=stage,
                     trial_dir=str(out.resolve()), memory_capacity_gb=memory_capacity_gb, seed=seed)


def _fmt(value: float, spec: str = ".3f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def run_trial(backend: str, steps: int, out: Path, sets: list[str], config_file: Path | None, seed: int,
              backend_options: dict, stage: str | None = None) -> int:
    """Run one trial in the foreground; returns 0 completed, 1 failed, 3 oom, 4 stopped, 2 bad input.

    ``stage``: run it as a stage-1 (``system``: no validation, throughput only) or stage-2 (``learning``)
    trial would run; None = like a learning trial (validated at the end).
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mart.trial_runner.registry import load_backend

    console = Console(stderr=True)
    try:
        be = load_backend(backend, **backend_options)
        missing = be.missing_requirement()
        if missing:
            raise InputError(missing)
        spec = prepare(be, steps, Path(out), sets, config_file, seed, backend_options.get("memory_capacity_gb"),
                       stage=stage)
    except (InputError, ValueError) as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        console.print("no trial was started.")
        return EXIT_BAD_INPUT

    runner = be.make_runner()
    handle = runner.launch(spec)
    tail = runner.metrics(handle)
    score_prefix = getattr(be, "score_metric_prefix", "val-core/")
    val = math.nan
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[info]}")]
    # Ctrl-C sets a flag the loop reads: a KeyboardInterrupt raised at an arbitrary point (inside the progress
    # display's or the runner's locks) could leave the stop below waiting on a lock the interrupted code held
    interrupted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task(f"{be.name} trial", total=steps, info="starting")
            while not interrupted:
                for rec in tail.read_new():
                    val = next((v for k, v in rec.data.items() if k.startswith(score_prefix)), val)
                    thr = f"{_fmt(rec.get(THROUGHPUT_KEY), '.0f')} tok/s"
                    if COMPARED_THROUGHPUT_KEY in rec.data:  # the figure a tuning session would compare
                        thr += f" (compared {_fmt(rec.get(COMPARED_THROUGHPUT_KEY), '.0f')})"
                    info = (f"reward {_fmt(rec.get('critic/score/mean'))}  val {_fmt(val)}  {thr}  "
                            f"mem {_fmt(rec.get('perf/max_memory_allocated_gb'), '.3f')} GB")
                    progress.update(task, completed=rec.step, info=info)
                poll = runner.poll(handle)
                if poll.status.is_finished():
                    break
                time.sleep(0.2)
        if interrupted:
            console.print("interrupted: stopping the trial ...")
            poll = runner.stop(handle, reason="interrupted by the user (Ctrl-C)", grace_s=5.0)
    finally:
        signal.signal(signal.SIGINT, previous)
        runner.close()
    colour = "green" if poll.status is TrialStatus.COMPLETED else "red"
    console.print(f"[{colour}]{poll.status.value}[/]" + (f": {escape(poll.reason)}" if poll.reason else "")
                  + f" (last step {poll.last_step}, val {_fmt(val)})", highlight=False, soft_wrap=True)
    console.print(escape(f"metrics: {Path(spec.trial_dir) / METRICS_FILE}   log: {Path(spec.trial_dir) / 'trial.log'}"),
                  soft_wrap=True)
    return EXIT_CODES.get(poll.status, 1)
