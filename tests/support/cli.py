"""The ``mart`` command line in this process (typer's runner), and the short runs the CLI tests start from."""

from __future__ import annotations

import json
from typing import Any

TOY = "tests.support.toy_backend:make_backend"


def cli(*args: str, stdin: str | None = None):
    from typer.testing import CliRunner

    from mart.graph.cli import app

    return CliRunner().invoke(app, list(args), input=stdin)


def paused_toy_run(runs: str, *extra: str) -> dict[str, Any]:
    """``mart tune --approve none`` on the toy backend (3 system trials, no stage 2): paused at review #1."""
    out = cli("tune", "--backend", TOY, "--approve", "none", "--runs-dir", str(runs), "--json", "-q",
              "--system-trials", "3", "--learning-trials", "0", "--system-horizon", "3", "--watch-interval-s", "0.01",
              "--no-report", *extra)
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def sim_stage2_options(runs_dir: Any, seed: int = 0, **kw: Any):
    """A sim session with a noisy stage 2 worth re-running on a second seed (qwen3-8b-1x8, 6 learning trials of 30
    steps, up to 3 re-runs)."""
    from mart.state.options import TuneOptions

    opts = dict(backend="sim", backend_options={"scenario": "qwen3-8b-1x8", "seed": seed, "clock": "poll"},
                approve="auto", agents="rules", runs_dir=str(runs_dir), seed=seed, system_trials=2, learning_trials=6,
                learning_horizon=30, learning_confirm_trials=3, quiet=True, report=False, watch_interval_s=0.01,
                system_remeasure_share=0.25)  # stage 2 is what these sessions are for
    return TuneOptions(**{**opts, **kw})
