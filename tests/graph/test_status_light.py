"""`mart status RUN` reads a stopped run from the ledger, without compiling the graph (no LangGraph import: it
starts in well under a second), and says exactly what the graph's checkpoints say; once anything else moves the
graph (a notebook answering the review), it reads the checkpoints again."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mart.graph.run_status import run_status
from mart.state.run_store import RunStore
from tests.support.cli import cli, paused_toy_run
from tests.support.paths import REPO

VOLATILE = ("age_s", "updated_at")


def _status(runs, run, **kw):
    store = RunStore.open(run, runs, readonly=True)
    try:
        return {k: v for k, v in run_status(store, **kw).items() if k not in VOLATILE}
    finally:
        store.close()


def _imports_of_status(runs, run) -> list[str]:
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom mart.graph.cli import app\n"
            f"r = CliRunner().invoke(app, ['status', {run!r}, '--runs-dir', {str(runs)!r}, '--json'])\n"
            "assert r.exit_code == 0, r.output\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('langgraph', 'langchain_core', 'matplotlib')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return json.loads(out.stdout.strip().replace("'", '"'))


def test_status_of_a_stopped_run_comes_from_the_ledger_and_matches_the_graph(tmp_path):
    runs = str(tmp_path)
    first = paused_toy_run(runs)
    run = first["run_id"]
    paused = _status(runs, run)
    assert paused == _status(runs, run, from_graph=True)
    assert paused["status"] == "paused" and paused["pending_review"]["interrupt_id"] == \
        first["pending_review"]["interrupt_id"]
    assert _imports_of_status(tmp_path, run) == []  # no LangGraph, LangChain or matplotlib for `mart status`

    # a notebook answers the review: the ledger's record is stale, and status reads the graph instead
    from mart.graph.api import open_run

    with open_run(run, runs_dir=runs) as handle:
        nxt = handle.decide({"action": "approve"})
    assert nxt["review_no"] == 2
    moved = _status(runs, run)
    assert moved["pending_review"]["review_no"] == 2 and moved == _status(runs, run, from_graph=True)

    done = json.loads(cli("review", run, "--runs-dir", runs, "--approve", "--json", "-q").stdout)
    while done["status"] == "paused":
        done = json.loads(cli("review", run, "--runs-dir", runs, "--approve", "--json", "-q").stdout)
    completed = _status(runs, run)
    assert completed["status"] == "completed" and completed == _status(runs, run, from_graph=True)
    assert _imports_of_status(tmp_path, run) == []
