"""Runs driven by LangGraph Studio, seen from the CLI: `mart status` shows their real trials and state from the
ledger; `mart resume` / `mart review` refuse them with what to do instead (their graph state lives in the Studio
server: resuming here would start the graph over). The Studio graph is driven in-process with an in-memory
checkpointer, as the Studio server drives it (tests/graph/test_studio.py runs the real server)."""

from __future__ import annotations

import json
import sqlite3

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from typer.testing import CliRunner

from mart.graph.builder import make_builder
from mart.graph.cli import app
from mart.graph.studio import StudioInput

SIM = {"backend": "sim", "backend_options": {"clock": "poll"}, "system_trials": 3, "learning_trials": 0,
       "system_horizon": 2, "watch_interval_s": 0.01, "quiet": True}


@pytest.fixture
def studio_runs(tmp_path):
    graph = make_builder(context_schema=None, input_schema=StudioInput).compile(checkpointer=InMemorySaver())
    for thread in ("new", "legacy"):
        out = graph.invoke({"options": {**SIM, "runs_dir": str(tmp_path)}}, {"configurable": {"thread_id": thread}})
        assert out["__interrupt__"], "the Studio thread waits at its first review"
    # a run made before the ledger recorded its driver
    with sqlite3.connect(tmp_path / "studio-legacy" / "mart.sqlite") as conn:
        conn.execute("update runs set driver = null, thread_id = null")
    return tmp_path


@pytest.mark.parametrize("thread", ["new", "legacy"])
def test_status_resume_and_review_of_a_studio_run(studio_runs, thread):
    runner = CliRunner()
    run = f"studio-{thread}"
    res = runner.invoke(app, ["status", run, "--runs-dir", str(studio_runs), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert (info["status"], info["waiting_for"], info["thread_id"]) == ("paused", "LangGraph Studio", thread)
    assert info["trials_done"] == {"system": 1}  # the baseline ran in the Studio thread
    text = runner.invoke(app, ["status", run, "--runs-dir", str(studio_runs)]).output
    assert "paused (waiting for LangGraph Studio), stage system, trials done: system 1" in text
    assert "{" not in text  # no Python dict reprs for people
    listing = runner.invoke(app, ["status", "--runs-dir", str(studio_runs)])
    assert listing.exit_code == 0 and f"LangGraph Studio (thread {thread})" in listing.output
    for cmd in (["resume", run], ["review", run, "--approve"]):
        res = runner.invoke(app, [*cmd, "--runs-dir", str(studio_runs)])
        assert res.exit_code != 0
        assert f"driven by LangGraph Studio (thread {thread})" in res.output and "runs.wait" in res.output
    # nothing ran and no graph was started in the run folder
    with sqlite3.connect(studio_runs / run / "mart.sqlite") as conn:
        assert conn.execute("select count(*) from trials").fetchone()[0] == 1
        tables = {r[0] for r in conn.execute("select name from sqlite_master where type='table'")}
        if "checkpoints" in tables:
            assert conn.execute("select count(*) from checkpoints").fetchone()[0] == 0
