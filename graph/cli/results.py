"""The commands that read what a finished run found: `mart report`, `mart export`."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Optional

import typer

from mart.graph.cli.errors import fail, one_line_errors, os_cause
from mart.graph.cli.flags import RUNS_DIR


@one_line_errors
def report(
    run: str = typer.Argument(..., help="Run id or run directory."),
    runs_dir: Path = RUNS_DIR,
    fmt: str = typer.Option("html", "--format", help="html (self-contained page) or md (Markdown for a terminal or CI)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where to write the page (default: RUN/report.html or .md)."),
) -> None:
    """Write the run's report: best-so-far, phase breakdown, memory, calibration, learning curves, reviews, config.

    The figures are PNGs in RUN/report/, embedded in the HTML page so it stands alone.
    """
    from mart.graph.report import write_report
    from mart.state.run_store import RunError, RunStore

    if fmt not in ("html", "md"):
        fail(f"--format must be html or md, got {fmt!r}")
    try:
        store = RunStore.open(run, runs_dir, contained=False)  # reads the run, writes only its report
        run_dir = store.run_dir
        store.close()
        path = write_report(run_dir, fmt, out)
    except RunError as e:
        fail(str(e))
    except (OSError, sqlite3.Error) as e:  # a full disk, a read-only folder, a planted link: nothing half-written
        fail(f"cannot write the report: {os_cause(e)}", 1)
    typer.echo(str(path))


@one_line_errors
def export(
    run: str = typer.Argument(..., help="Run id or run directory."),
    runs_dir: Path = RUNS_DIR,
    schedule: bool = typer.Option(False, "--schedule", help="Export the schedule (stage 3) instead of the final config."),
    fmt: str = typer.Option("yaml", "--format", help="yaml, json, or sh: a bash script launching verl with the final "
                            "config (with --schedule: one verl launch per segment), your base overrides as its "
                            "arguments."),
    checkpoint_dir: str = typer.Option("checkpoints/mart-schedule", help="--schedule: where the segments' verl "
                                       "launches keep and resume their checkpoints."),
) -> None:
    """Print what the run found as your next training config: the final config's overrides, or (--schedule) the
    per-segment schedule and the verl launch of each segment, resuming from the previous one's checkpoint."""
    from mart.graph.export import config_script, final_config, render, schedule_document
    from mart.graph.report_data import as_yaml
    from mart.state.run_store import RunError, RunStore

    if fmt not in ("yaml", "json", "sh"):
        fail(f"--format must be yaml, json or sh, got {fmt!r}")
    try:
        store = RunStore.open(run, runs_dir, readonly=True)
    except RunError as e:
        fail(str(e))
    try:
        row = store.ledger.run(store.run_id) or {}
    finally:
        store.close()
    summary, options = row.get("summary") or {}, row.get("options") or {}
    if row.get("status") != "completed" or not summary:
        fail(f"run {store.run_id} is {row.get('status') or 'not started'}: nothing to export yet")
    if schedule:
        try:
            typer.echo(render(schedule_document(summary, options, checkpoint_dir), fmt), nl=False)
        except ValueError as e:
            fail(str(e))
        return
    if fmt == "sh":
        typer.echo(config_script(summary, options), nl=False)
        return
    config = final_config(summary, options)
    typer.echo(json.dumps(config, indent=2) if fmt == "json" else as_yaml(config), nl=fmt != "json")
