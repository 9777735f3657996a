"""`mart trial`: one trial in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mart.graph.cli.flags import BackendFlags, backend_flags


@backend_flags
def trial(
    backend: str = typer.Option("local", help="Backend: local, verl, sim, or package.module:factory."),
    steps: int = typer.Option(10, min=1, help="Training steps (the trial's horizon)."),
    out: Path = typer.Option(..., help="Trial directory (metrics.jsonl, status.json, trial.log)."),
    set_: list[str] = typer.Option([], "--set", help="Override KEY=VALUE (verl key names); repeatable."),
    config: Optional[Path] = typer.Option(None, help="YAML or JSON file of KEY: VALUE overrides (flat verl keys)."),
    memory_capacity_gb: Optional[float] = typer.Option(
        None, help="Memory capacity in GB (emulated GPU memory on CPU): a peak above it ends the trial as oom."
    ),
    seed: int = typer.Option(0, help="Random seed."),
    stage: Optional[str] = typer.Option(
        None, help="Run it as a tuning stage would: system (throughput, no validation) or learning (validated at the end)."),
    backend_flags: Optional[dict] = None,  # the BackendFlags fields, filled in by @backend_flags
) -> None:
    """Run one trial in the foreground and show its progress."""
    from mart.trial_runner.trial_command import run_trial

    code = run_trial(
        backend=backend,
        steps=steps,
        out=out,
        sets=set_,
        config_file=config,
        seed=seed,
        backend_options=BackendFlags(**backend_flags).backend_options(memory_capacity_gb=memory_capacity_gb),
        stage=stage,
    )
    raise typer.Exit(code)
