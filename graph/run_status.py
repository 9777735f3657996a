"""Where a run stands (``mart status``), from the ledger whenever it can.

A driver that stops (a pause at a review, the end of the session) records in the ledger's run row what
``run_status`` shows (stage, counters, the pending review) with a fingerprint of the graph's last checkpoint; while
that checkpoint is still the last one, the status is read from there without compiling the graph (``mart status``
and the run listing stay light: no LangGraph import). Anything else (a run killed mid-step, a notebook that moved
the graph on) is read from the graph's checkpoints.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from mart.state.run_store import WATCH_LOCK, RunError, RunStore


class StudioRun(RunError):
    """The run is driven by LangGraph Studio: its graph state lives in the Studio server, not here."""


def studio_thread(store: RunStore) -> str | None:
    """The LangGraph Studio thread driving this run, or None.

    Studio's server refuses graphs that bring a checkpointer, so a Studio run's folder holds its ledger and
    trials but no graph checkpoints: resuming it here would start the graph over. Runs made before the
    ledger recorded the driver are recognised by their ``studio-`` name and an empty checkpoint table.
    """
    try:
        row = store.ledger.run(store.run_id) or {}
    except ValueError:  # unparseable JSON columns: load_options reports them
        row = {}
    if row.get("driver") == "studio":
        return row.get("thread_id") or store.run_id.removeprefix("studio-")
    if store.run_id.startswith("studio-") and not _has_checkpoints(store):
        return store.run_id.removeprefix("studio-")
    return None


def _has_checkpoints(store: RunStore) -> bool:
    db = store.ledger.db
    if not db.execute("select 1 from sqlite_master where type='table' and name='checkpoints'").fetchone():
        return False
    return bool(db.execute("select 1 from checkpoints where thread_id = ? limit 1", [store.run_id]).fetchone())


#: LangGraph's strict resume mode (langgraph >= 1.2.20; the SDK's ``strict_resume``): a resume naming an interrupt
#: that is no longer pending is refused with ``UnknownInterruptError`` before anything is written. The key is
#: private in LangGraph; tests/graph/test_promises_review.py proves it against the installed version.
STRICT_RESUME = "__pregel_strict_resume"


def graph_config(run_id: str) -> dict[str, Any]:
    # Never put secrets in `configurable`: LangGraph copies some of it into checkpoint metadata.
    return {"configurable": {"thread_id": run_id, STRICT_RESUME: True}, "recursion_limit": 100_000}


def state_snapshot(store: RunStore):
    """The run's current state snapshot (closes its checkpoint connection: servers call this often)."""
    refuse_studio_run(store, "read its reviews")
    from mart.graph.builder import (
        compile_graph,  # LangGraph only when a snapshot is needed: status stays light
    )

    saver = store.checkpointer()
    try:
        return compile_graph(saver).get_state(graph_config(store.run_id))
    finally:
        saver.conn.close()


def refuse_studio_run(store: RunStore, doing: str) -> None:
    """Raise ``StudioRun`` (what to do instead) when LangGraph Studio drives this run."""
    thread = studio_thread(store)
    if thread:
        raise StudioRun(
            f"run {store.run_id} is driven by LangGraph Studio (thread {thread}): its graph state lives in the "
            f"Studio server, not in the run folder, so mart cannot {doing} here. Answer its review in Studio, "
            f"or with the SDK: get_sync_client(url=STUDIO_URL).runs.wait({thread!r}, 'mart', "
            "command={'resume': {'action': 'approve'}})")


def review_request(snap) -> dict[str, Any] | None:
    """The pending review request of a state snapshot, with its ``interrupt_id``; None when not paused.

    The interrupt id changes with every review (and when a review is re-asked after an invalid answer),
    so a channel can tell a stale answer from a current one.
    """
    if not snap.interrupts:
        return None
    intr = snap.interrupts[0]
    return {**intr.value, "interrupt_id": intr.id}


def checkpoint_fingerprint(store: RunStore) -> str | None:
    """The thread's last checkpoint and how many pending writes it has (an interrupt asked again, a resume answer):
    it changes whenever the graph moves, whoever moved it. Plain SQL on LangGraph's tables, no LangGraph import."""
    db = store.ledger.db
    if not db.execute("select 1 from sqlite_master where type='table' and name='checkpoints'").fetchone():
        return None
    row = db.execute("select checkpoint_id from checkpoints where thread_id = ? and checkpoint_ns = '' "
                     "order by checkpoint_id desc limit 1", [store.run_id]).fetchone()
    if row is None:
        return None
    writes = 0
    if db.execute("select 1 from sqlite_master where type='table' and name='writes'").fetchone():
        writes = db.execute("select count(*) from writes where thread_id = ? and checkpoint_ns = '' and "
                            "checkpoint_id = ?", [store.run_id, row[0]]).fetchone()[0]
    return f"{row[0]}:{writes}"


def status_snapshot(store: RunStore, snap: Any) -> dict[str, Any]:
    """What ``run_status`` reads from a state snapshot, with the checkpoint it belongs to (kept in the run row)."""
    values = snap.values or {}
    return {"fingerprint": checkpoint_fingerprint(store), "stage": values.get("stage"), "next": list(snap.next),
            "trials_done": values.get("trials_done") or {}, "slots": (values.get("options") or {}).get("parallel", 1),
            "pending_review": review_request(snap)}


def recorded_snapshot(store: RunStore, row: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """What the ledger's run row recorded of the graph at the driver's last stop (``status_snapshot``) while that is
    still the graph's last checkpoint; None when the graph moved since (read it then). Callers that do not hold the
    run's lock check first that no driver is moving it."""
    if row is None:
        row = store.ledger.run(store.run_id) or {}
    recorded = row.get("snapshot") if isinstance(row.get("snapshot"), dict) else None
    if recorded is None or recorded.get("fingerprint") != checkpoint_fingerprint(store):
        return None
    return recorded


def run_status(store: RunStore, *, from_graph: bool = False) -> dict[str, Any]:
    """Where a run stands: running / paused / completed / failed, the running trial, pending review.

    ``from_graph``: read the graph's checkpoints even when the ledger's record of the last stop is current."""
    row = store.ledger.run(store.run_id) or {}
    status = row.get("status") or "created"
    holder = store.lock_holder()
    thread = studio_thread(store)
    if thread:
        return _studio_status(store, row, thread)
    if store.readonly and not _has_checkpoints(store):  # killed before its first checkpoint
        return {**_ledger_status(store, row), "status": "paused" if status != "failed" else status,
                "waiting_for": "resume", "driver_pid": holder}
    recorded = None if from_graph or holder else recorded_snapshot(store, row)
    if recorded is None:
        recorded = status_snapshot(store, state_snapshot(store))
    waiting_for = None
    if holder:
        status = "running"
    elif status in ("running", "created", "paused"):
        status = "paused"
        waiting_for = "review" if recorded["pending_review"] else "resume"
    trials = store.ledger.trials()
    running = _running_rows(store, trials)
    return {
        "run_id": store.run_id,
        "run_dir": str(store.run_dir),
        "status": status,
        "waiting_for": waiting_for,
        "driver_pid": holder,
        "watcher_pid": store.lock_holder(WATCH_LOCK),  # a `mart watch` of the trials in flight while none drives
        "stage": recorded["stage"],
        "next": recorded["next"],
        "trials_done": recorded["trials_done"],
        "running_trial": running[0] if running else None,
        "running_trials": running,
        "slots": recorded["slots"],
        "pending_review": recorded["pending_review"],
        "summary": row.get("summary"),
        "error": row.get("error"),
        "updated_at": row.get("updated_at"),
        "age_s": None if not row.get("created_at") else round(time.time() - row["created_at"], 1),
    }


def _running_rows(store: RunStore, trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every trial the ledger has in flight: id, stage, kind, slot, steps so far, horizon, when it started, and
    what it waits for while it is queued (its resources on a cluster); beside them, what its own folder holds
    (``on_disk``), which runs ahead of the ledger while no tuner reads the trial (a run paused at a review)."""
    return [{"trial_id": t["trial_id"], "stage": t["stage"], "kind": t["kind"], "slot": t.get("slot"),
             "steps_done": len(store.ledger.metric_records(t["trial_id"])), "horizon": t.get("horizon"),
             "started_at": t.get("started_at"), "queued": t.get("waiting"),
             "on_disk": trial_folder_progress(store, t["trial_id"])}
            for t in trials if t["status"] == "running"]


#: a metrics stream larger than this is not read by ``mart status`` (a run folder is untrusted input)
_STATUS_READ_MAX = 64 << 20


def trial_folder_progress(store: RunStore, trial_id: str) -> dict[str, Any] | None:
    """The steps a trial's folder holds (its ``metrics.jsonl``) and how it ended (``status.json``), read without
    writing anything and without leaving the folder (a link is followed only to a file inside it: a verl trial's
    ``metrics.jsonl`` links to its attempt's); None when there is no such folder. A local trial writes both
    itself, so they run on while the tuner is away; a verl attempt writes its metrics (its end is read from its
    exit code by the next tuner); a Ray job's copy is only as new as the last time a tuner read it."""
    from mart.state.trials import METRICS_FILE, STATUS_FILE
    from mart.trial_runner.base import read_status
    from mart.trial_runner.metrics import MetricsTail

    folder = store.run_dir / "trials" / trial_id
    if folder.is_symlink() or not folder.is_dir():
        return None
    metrics = _inside(folder, METRICS_FILE)
    steps = 0
    if metrics is not None and metrics.stat().st_size <= _STATUS_READ_MAX:
        steps = len({r.step for r in MetricsTail(metrics).read_new()})
    ended = None
    status = _inside(folder, STATUS_FILE)
    if status is not None:
        try:
            ended = read_status(folder)  # its status.json: a file inside the folder, checked above
        except (OSError, KeyError, TypeError, ValueError):  # a status file that is not a trial's
            ended = None
    return {"steps": steps, "ended": ended.status.value if ended is not None else None}


def _inside(folder: Path, name: str) -> Path | None:
    """``folder/name`` resolved, when it is a regular file inside ``folder`` (through links or not); else None."""
    try:
        real = (folder / name).resolve(strict=True)
        root = folder.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return real if real.is_relative_to(root) and real.is_file() else None


def _ledger_status(store: RunStore, row: dict[str, Any]) -> dict[str, Any]:
    """What the ledger alone says of a run (no graph checkpoint to read)."""
    trials = store.ledger.trials()
    done: dict[str, int] = {}
    for t in trials:
        if t["status"] not in ("running", "pending"):
            done[t["stage"]] = done.get(t["stage"], 0) + 1
    running = _running_rows(store, trials)
    return {
        "run_id": store.run_id, "run_dir": str(store.run_dir), "status": row.get("status") or "created",
        "waiting_for": None, "driver_pid": None, "stage": trials[-1]["stage"] if trials else None, "next": [],
        "trials_done": done,
        "running_trial": running[0] if running else None, "running_trials": running,
        "pending_review": None, "summary": row.get("summary"), "error": row.get("error"),
        "updated_at": row.get("updated_at"),
        "age_s": None if not row.get("created_at") else round(time.time() - row["created_at"], 1),
    }


def _studio_status(store: RunStore, row: dict[str, Any], thread: str) -> dict[str, Any]:
    """A Studio run's status from its ledger: trials and stage are real; whether it waits at a review is
    known only to the Studio server, so an unfinished run without a running trial waits "in LangGraph Studio"."""
    info = _ledger_status(store, row)
    if info["status"] not in ("completed", "failed"):
        info["status"] = "running" if info["running_trial"] else "paused"
        info["waiting_for"] = None if info["running_trial"] else "LangGraph Studio"
    return {**info, "driver": "studio", "thread_id": thread}
