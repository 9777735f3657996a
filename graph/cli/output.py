"""What the commands print: JSON, the rich console, a session's summary."""

from __future__ import annotations

from pathlib import Path

import typer

from mart.graph.cli.errors import hint_ref


def print_json(data) -> None:
    import json

    typer.echo(json.dumps(data, indent=2, default=str))


def plain_tree(value):
    """Every string in a summary (run ids, notes, configs from the ledger) without terminal controls."""
    from mart.state.text import plain

    if isinstance(value, str):
        return plain(value)
    if isinstance(value, dict):
        return {plain_tree(k): plain_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_tree(v) for v in value]
    return value


def print_summary(summary: dict, ref: str | None = None) -> None:
    from rich.table import Table

    summary = plain_tree(summary)
    console = new_console()
    if summary.get("status") == "paused":
        from mart.graph.reviewers.base import format_request

        run = ref or summary["run_id"]
        if summary.get("pending_review"):  # what waits: the next candidate(s), so a reviewer sees what comes next
            console.print(format_request(summary["pending_review"]))
        console.print(f"run {run} is paused at a review: answer with `mart review {run}` (on this terminal), or "
                      f"`mart review {run} --approve | --reject TEXT | --edit KEY=VALUE`", soft_wrap=True)  # copyable
        return
    from mart.graph.figures import stage_figures
    from mart.state.units import fmt_gb

    sys_, trials = summary["system"], summary["trials"]
    table = Table(title=f"mart run {summary['run_id']}: {summary['status']}")
    table.add_column("stage")
    table.add_column("baseline", justify="right")
    table.add_column("best", justify="right")
    table.add_column("gain", justify="right")
    table.add_column("best config")

    for f in stage_figures(summary):  # the same figures and names as the report and Slack
        table.add_row(f"{f.stage} ({f.label})", f.baseline, f.best, f.gain, "\n".join(f.config) or "baseline")
        if f.interval:  # how sure the gain is, and the measurements behind it
            table.add_row(f"{f.stage} (gain's interval)", "", "", "", f.interval)
        if f.hours is not None:  # what one training run costs, beside what it scores
            table.add_row(f"{f.stage} (GPU-hours of one run)", f.hours[0], f.hours[1], "", f"search: {f.hours[2]}")
    console.print(table)
    console.print(f"memory limit {fmt_gb(sys_['memory_limit_gb'], '-')}, best system peak "
                  f"{fmt_gb(sys_['best_peak_memory_gb'], '-')}; trials: {trials['total']} total, "
                  f"{trials['early_stopped']} stopped early, {trials['failed']} failed/oom")
    agents = summary.get("agents") or {}
    if agents.get("calls"):
        cost = f", ${agents['cost_usd']:.4f}" if agents.get("cost_usd") else ""
        console.print(f"LLM agents: {agents['calls']} calls, {agents['prompt_tokens']}+{agents['completion_tokens']} "
                      f"tokens{cost}, {agents['fallbacks']} fell back to rules")
    for note in summary.get("notes") or []:
        console.print(f"note: {note}", markup=False)
    if summary.get("report"):
        console.print(f"report: {summary['report']}", markup=False)


def new_console():
    import sys

    from rich.console import Console

    # piped output (CI, logs) gets a wide table instead of rich's 80-column default. markup off: every
    # string shown here (run ids, configs, reasons, notes, paths) is data, and "[/x]" must print as is
    return Console(width=None if sys.stdout.isatty() else 200, markup=False, highlight=False)


def finish(summary: dict, as_json: bool, runs_dir: str | Path = "runs") -> None:
    from mart.graph.session import OPTIONAL_SUMMARY_KEYS, SUMMARY_KEYS

    if as_json:
        keys = [*SUMMARY_KEYS, *(k for k in OPTIONAL_SUMMARY_KEYS if summary.get(k) is not None)]
        print_json(summary if summary.get("status") == "paused" else {k: summary.get(k) for k in keys})
    else:
        print_summary(summary, hint_ref(summary["run_id"], runs_dir) if summary.get("run_id") else None)
    if summary.get("status") == "failed":
        from mart.state.text import one_line

        # the error quotes a trial's failure, read from its log: foreign text, one line without terminal controls
        typer.echo(f"error: the session failed: {one_line(summary.get('error'))}", err=True)
        raise typer.Exit(1)
