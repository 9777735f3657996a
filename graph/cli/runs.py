"""The commands that read or act on a run's trials: `mart status`, `mart trials`, `mart watch`, `mart stop`."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Optional

import typer

from mart.graph.cli.errors import fail, hint_ref, io_fail, one_line_errors
from mart.graph.cli.flags import (
    BACKEND_AGAIN,
    ENTRYPOINT_AGAIN,
    JSON,
    LLM_URL_AGAIN,
    RAY_ADDRESS_AGAIN,
    RUNS_DIR,
    TRUST_RUN,
    allowed,
)
from mart.graph.cli.output import new_console, print_json
from mart.state.options import WATCH_INTERVAL_S


@one_line_errors
def status(
    run: Optional[str] = typer.Argument(None, help="Run id or run directory (default: list the runs)."),
    runs_dir: Path = RUNS_DIR,
    pending: bool = typer.Option(False, "--pending", help="Without RUN: only runs waiting for a review."),
    as_json: bool = JSON,
) -> None:
    """Where a run stands: running, paused (at a review, or waiting for resume), completed, failed.

    Without RUN: every run in --runs-dir with its pending review, if any.
    """
    from mart.graph.reviewers.base import format_request
    from mart.graph.run_status import run_status
    from mart.state.run_store import RunError, RunStore
    from mart.state.text import one_line

    if run is None:
        list_runs(runs_dir, pending, as_json)
        return
    try:
        store = RunStore.open(run, runs_dir, readonly=True)  # status never writes: read-only media work
        try:
            info = run_status(store)
        finally:
            store.close()
    except RunError as e:
        fail(str(e))
    if as_json:
        print_json(info)
        return
    # every line below shows text from the run folder (foreign): without terminal controls
    typer.echo(one_line(f"run {info['run_id']}: {info['status']}"
               + (f" (waiting for {info['waiting_for']})" if info["waiting_for"] else "")
               + (f", stage {info['stage']}" if info["stage"] else "")
               + ", trials done: " + (", ".join(f"{k} {v}" for k, v in (info["trials_done"] or {}).items()) or "none")))
    running = info.get("running_trials") or ([info["running_trial"]] if info.get("running_trial") else [])
    for t in running:  # every trial in flight (several with --parallel)
        slot = f", slot {t['slot'] + 1}" if t.get("slot") is not None and (info.get("slots") or 1) > 1 else ""
        where = f"queued ({t['queued']})" if t.get("queued") else f"{t['steps_done']}/{t['horizon']} steps"
        disk, label = t.get("on_disk") or {}, "running trial"
        ended = disk.get("ended")
        if not info.get("driver_pid") and (ended or (disk.get("steps") or 0) > t["steps_done"]):
            # no tuner reads the trial now: its own folder is newer than the ledger
            label = "trial" if ended else label
            where = ((f"ended ({ended}), " if ended else "") + f"{disk.get('steps', 0)}/{t['horizon']} steps in its "
                     "folder; the ledger takes it in when the run continues")
        typer.echo(one_line(f"{label} {t['trial_id']} ({t['kind']}, {t['stage']}{slot}): {where}"))
    if not info.get("driver_pid") and any(not (t.get("on_disk") or {}).get("ended") for t in running):
        typer.echo(one_line(f"the trials in flight are watched by `mart watch` (pid {info['watcher_pid']})"
                            if info.get("watcher_pid") else f"no tuner watches the trials in flight: "
                            f"`mart watch {store.ref}` keeps the health monitor on them, `mart stop {store.ref}` "
                            "stops them"))
    if info["pending_review"]:
        typer.echo("pending review:\n" + format_request(info["pending_review"]))
    if info["error"]:
        typer.echo(one_line(f"error: {info['error']}"))
    lost = store.untracked_trials()
    if lost:  # the ledger is behind its trial folders: what status shows is older than what ran
        typer.echo(one_line(f"warning: trial folders the ledger does not know: {', '.join(lost)} (mart.sqlite-wal "
                            f"lost after a kill?); `mart resume {store.ref}` refuses this run until that is resolved"))
    report = store.run_dir / "report.html"
    if report.is_file():
        typer.echo(one_line(f"report: {report}"))


def list_runs(runs_dir: Path, pending_only: bool, as_json: bool) -> None:
    from rich.table import Table

    from mart.graph.run_status import run_status
    from mart.state.ledger import DB_FILE
    from mart.state.run_store import RunError, RunStore, run_ref
    from mart.state.text import one_line

    if runs_dir.exists() and not runs_dir.is_dir():
        fail(f"--runs-dir {runs_dir} is not a directory")
    infos = []
    for path in sorted(p for p in runs_dir.glob("*") if not p.name.startswith(".") and (p / DB_FILE).exists()):
        try:
            store = RunStore.open(path, runs_dir, readonly=True)
            try:
                infos.append(run_status(store))
            finally:
                store.close()
        except RunError:
            continue
    if pending_only:
        infos = [i for i in infos if i["pending_review"]]
    if as_json:
        print_json(infos)
        return
    if not infos:
        typer.echo(f"no {'pending reviews' if pending_only else 'runs'} in {runs_dir}")
        return
    table = Table(title=one_line(f"runs in {runs_dir}"))
    for col in ("run", "status", "stage", "trials", "pending review", "answer with"):
        table.add_column(col)
    for i in infos:
        req = i["pending_review"]
        cells = (i["run_id"], i["status"] + (f" ({i['waiting_for']})" if i["waiting_for"] else ""),
                 i["stage"] or "-", str(sum((i["trials_done"] or {}).values())),
                 review_cell(req) if req else "-",
                 f"mart review {run_ref(i['run_dir'], runs_dir)}" if req else
                 f"LangGraph Studio (thread {i['thread_id']})" if i.get("driver") == "studio" and i["status"] == "paused"
                 else "")
        table.add_row(*map(one_line, cells))  # run folders are foreign: no terminal controls
    new_console().print(table)


def review_cell(req: dict) -> str:
    cands = req.get("candidates") or []
    if len(cands) == 1:
        return f"#{req['review_no']} {cands[0].get('candidate_id')} ({len(cands[0].get('diff') or [])} changes)"
    return f"#{req['review_no']} {len(cands)} candidates"


@one_line_errors
def trials(
    run: str = typer.Argument(..., help="Run id or run directory."),
    runs_dir: Path = RUNS_DIR,
    as_json: bool = JSON,
) -> None:
    """The run's trials from the ledger."""
    from rich.table import Table

    from mart.graph.figures import knob_text
    from mart.state.run_store import RunError, RunStore
    from mart.state.text import one_line

    try:
        store = RunStore.open(run, runs_dir, readonly=True)
    except RunError as e:
        fail(str(e))
    try:
        rows = store.ledger.trials()
    finally:
        store.close()
    if as_json:
        print_json(rows)
        return
    table = Table(title=f"trials of {one_line(store.run_id)}")
    for col in ("trial", "stage", "kind", "status", "steps", "tok/s", "peak GB", "score", "changes / reason"):
        table.add_column(col)
    for r in rows:
        def f(v, spec=".4g"):
            return "-" if v is None else format(v, spec)
        changes = knob_text(r.get("overrides"))
        if r.get("parent_trial"):  # a schedule branch: from its parent's checkpoint
            changes = f"{changes or 'unchanged'} (from {r['parent_trial']} @ {r.get('parent_step')})"
        cells = (r["trial_id"], r["stage"], r["kind"], r["status"] + (" (early)" if r["early_stopped"] else ""),
                 str(r.get("steps_done") or 0), f(r.get("throughput"), ".1f"), f(r.get("peak_memory_gb"), ".3g"),
                 f(r.get("score"), ".3f"), changes or (r.get("reason") or "baseline"))
        table.add_row(*map(one_line, cells))  # ledger text is foreign: no terminal controls
    new_console().print(table)


@one_line_errors
def watch(
    run: str = typer.Argument(..., help="Run id (in --runs-dir) or a run directory's path."),
    runs_dir: Path = RUNS_DIR,
    interval: float = typer.Option(WATCH_INTERVAL_S, "--interval", min=0.01,
                                   help="Seconds between two reads of the trials."),
    backend: list[str] = BACKEND_AGAIN,
    verl_entrypoint: Optional[str] = ENTRYPOINT_AGAIN,
    llm_base_url: Optional[str] = LLM_URL_AGAIN,
    ray_address: Optional[str] = RAY_ADDRESS_AGAIN,
    trust_run: bool = TRUST_RUN,
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    as_json: bool = JSON,
) -> None:
    """Keep the health monitor on a paused run's trials in flight (no tuner alive: --approve none, Slack, a
    killed tuner) until they end, the run is continued, or Ctrl-C; a sick trial is stopped, the review stays open.
    """
    from mart.graph.paused_watch import watch_paused
    from mart.state.run_store import RunError
    from mart.state.text import one_line

    quiet = quiet or as_json

    def started(info: dict) -> None:
        if not quiet:
            at = f"while review #{info['review_no']} waits" if info.get("review_no") else "until the run is resumed"
            typer.echo(f"watching {len(info['watched'])} trial(s) of run {info['run_id']} in flight {at}: "
                       f"{', '.join(info['watched'])} (Ctrl-C stops watching; the trials run on)")

    def told(trial_id: str, what: str) -> None:
        if not quiet:
            typer.echo(one_line(f"{trial_id}: {'ended' if what == 'ended' else 'stopped, ' + what}"))

    from mart.graph.stop import Interrupts

    interrupts = Interrupts()
    try:
        with interrupts.installed():
            out = watch_paused(run, runs_dir, interval_s=interval, trust=trust_run, told=told, started=started,
                               allowed=allowed(backend, verl_entrypoint, llm_base_url, ray_address))
    except (RunError, ValueError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("stopped watching; the trials in flight run on (the tuner watches them when the run continues; "
              f"`mart stop {hint_ref(run, runs_dir)}` stops them)", 128 + (interrupts.first or 2))
    except (OSError, sqlite3.Error) as e:
        io_fail(e, hint_ref(run, runs_dir))
    if as_json:
        print_json(out)
    elif not quiet:
        typer.echo({"no trial in flight": f"run {out['run_id']}: no trial in flight, nothing to watch",
                    "every trial ended": "every trial watched has ended; the run takes them in when it continues",
                    "the run moved on": "the run is being continued: its tuner watches the trials now"}.get(
                        out["why"], "stopped watching"))


@one_line_errors
def stop(
    run: str = typer.Argument(..., help="Run id (in --runs-dir) or a run directory's path."),
    runs_dir: Path = RUNS_DIR,
    grace: float = typer.Option(5.0, "--grace", min=0.0, help="Seconds between SIGTERM and SIGKILL."),
) -> None:
    """Stop a run's trials in flight (after a Ctrl-C, a killed tuner, or while the run waits at a review).

    Only processes mart can prove it started are signalled (their launch token); the run stays as it is: `mart
    resume` continues it and reads each stopped trial's end from its folder.
    """
    from mart.graph.stop import stop_run
    from mart.state.run_store import RunError, RunLocked
    from mart.state.text import one_line

    try:
        store, results = stop_run(run, runs_dir, grace)
    except RunLocked as e:
        fail(f"{e} Stop its tuner first (Ctrl-C; a second Ctrl-C stops its trials too)")
    except RunError as e:
        fail(str(e))
    if not results:
        typer.echo(one_line(f"run {store.run_id}: no trial in flight, nothing to stop"))
        return
    for trial_id, what in results:
        typer.echo(one_line(f"{trial_id}: {what}"))
    if any("still runs" in what or "left alone" in what for _, what in results):  # not everything stopped
        raise typer.Exit(1)
