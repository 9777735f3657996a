"""``mart trial``: run one trial of any backend in the foreground and show its progress.

Generic over backends: it only uses ``Backend.base_config / validate_config / make_runner`` and the
trial-directory contract. Bad input (an unknown backend, a malformed ``--set``, an unreadable config
file, a config the backend rejects, an occupied ``--out``) prints a clear error, returns 2 and
starts nothing. Ctrl-C stops the trial (SIGTERM, grace, SIGKILL) and leaves a ``stopped`` status.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

from mart.state.models import TrialStatus
from mart.state.trials import METRICS_FILE, STATUS_FILE, TrialSpec

EXIT_CODES = {TrialStatus.COMPLETED: 0, TrialStatus.FAILED: 1, TrialStatus.OOM: 3, TrialStatus.STOPPED: 4}
"""Exit code of ``mart trial`` per final status (the local worker's codes); 2 = bad input, no trial."""
EXIT_BAD_INPUT = 2

_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


class InputError(ValueError):
    """The command line or a config file cannot be used."""


def parse_value(text: str) -> Any:
    """A ``--set`` value as YAML/JSON would read it: ints, floats (``1e-4`` too), bools, null, strings."""
    text = text.strip()
    try:
        import yaml

        value = yaml.safe_load(text) if text else ""
    except ImportError:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
    except Exception:  # noqa: BLE001 - not YAML: keep the text
        value = text
    return _numeric(value)


def _numeric(value: Any) -> Any:
    if isinstance(value, str) and _FLOAT.match(value):  # YAML 1.1 reads 1e-4 as a string
        return float(value) if any(c in value for c in ".eE") else int(value)
    return value


def parse_sets(sets: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("+")  # Hydra's "+key=value" means the same here
        if not sep or not key:
            raise InputError(f"--set expects KEY=VALUE, but got {item!r}.")
        out[key] = parse_value(value)
    return out


def _flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(_flatten(v, key + "."))
        else:
            flat[key] = _numeric(v)
    return flat


def read_config_file(path: Path) -> dict[str, Any]:
    """A YAML or JSON mapping of overrides; nested mappings are flattened to dotted verl keys."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InputError(f"cannot read config file {path}: {e.strerror or e}.") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            try:
                import yaml

                data = yaml.safe_load(text)
            except ImportError:
                data = json.loads(text)
    except Exception as e:  # noqa: BLE001 - a parser error of either kind
        raise InputError(f"cannot parse config file {path}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"config file {path} must hold a mapping of KEY: VALUE, not {type(data).__name__}.")
    return _flatten(data)


def prepare(backend: Any, steps: int, out: Path, sets: list[str], config_file: Path | None, seed: int,
            memory_capacity_gb: float | None = None) -> TrialSpec:
    """The validated trial spec, or ``InputError`` naming what is wrong (nothing is created)."""
    overrides: dict[str, Any] = {}
    if config_file is not None:
        overrides.update(read_config_file(Path(config_file)))
    overrides.update(parse_sets(sets))
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
    return TrialSpec(trial_id=out.resolve().name or "trial", config=config, steps=steps,
                     trial_dir=str(out.resolve()), memory_capacity_gb=memory_capacity_gb, seed=seed)


def _fmt(value: float, spec: str = ".3f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def run_trial(backend: str, steps: int, out: Path, sets: list[str], config_file: Path | None, seed: int,
              backend_options: dict) -> int:
    """Run one trial in the foreground; returns 0 completed, 1 failed, 3 oom, 4 stopped, 2 bad input."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mart.trial_runner.registry import load_backend

    console = Console(stderr=True)
    try:
        be = load_backend(backend, **backend_options)
        spec = prepare(be, steps, Path(out), sets, config_file, seed, backend_options.get("memory_capacity_gb"))
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
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task(f"{be.name} trial", total=steps, info="starting")
            while True:
                for rec in tail.read_new():
                    val = next((v for k, v in rec.data.items() if k.startswith(score_prefix)), val)
                    info = (f"reward {_fmt(rec.get('critic/score/mean'))}  val {_fmt(val)}  "
                            f"{_fmt(rec.get('perf/throughput'), '.0f')} tok/s  "
                            f"mem {_fmt(rec.get('perf/max_memory_allocated_gb'), '.3f')} GB")
                    progress.update(task, completed=rec.step, info=info)
                poll = runner.poll(handle)
                if poll.status.is_finished():
                    break
                time.sleep(0.2)
    except KeyboardInterrupt:
        console.print("interrupted: stopping the trial ...")
        poll = runner.stop(handle, reason="interrupted by the user (Ctrl-C)", grace_s=5.0)
    finally:
        runner.close()
    colour = "green" if poll.status is TrialStatus.COMPLETED else "red"
    console.print(f"[{colour}]{poll.status.value}[/]" + (f": {escape(poll.reason)}" if poll.reason else "")
                  + f" (last step {poll.last_step}, val {_fmt(val)})", highlight=False, soft_wrap=True)
    console.print(f"metrics: {Path(spec.trial_dir) / METRICS_FILE}   log: {Path(spec.trial_dir) / 'trial.log'}",
                  soft_wrap=True)
    return EXIT_CODES.get(poll.status, 1)
