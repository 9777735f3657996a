"""LangGraph Studio: `langgraph dev` with the project's langgraph.json, driven through langgraph_sdk.

The server runs from a scratch directory that links to the project's files (its own `.langgraph_api/`
store lands there, not in the repository), on 127.0.0.1 and a free port, and is stopped by its PID.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

for _module, _why in (("langgraph_cli", "langgraph-cli is not installed (pip install 'mart[studio]')"),
                      ("langgraph_runtime_inmem", "`langgraph dev` needs langgraph-cli[inmem]"),
                      ("langgraph_sdk", "langgraph-sdk is not installed")):
    # find_spec, not import: importing the in-memory runtime creates .langgraph_api/ in the cwd
    if importlib.util.find_spec(_module) is None:
        pytest.skip(_why, allow_module_level=True)

from langgraph_sdk import get_sync_client

from mart.graph.builder import compile_graph
from mart.state.ledger import Ledger
from tests.support.paths import REPO as REPO_ROOT
from tests.support.reviews import only

REPO = REPO_ROOT
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def studio(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    for entry in REPO.iterdir():
        if not entry.name.startswith(".") and entry.name not in ("runs", "langgraph.json"):
            (proj / entry.name).symlink_to(entry)
    # a copy, not a link: `langgraph dev` works in the directory of the resolved config file
    (proj / "langgraph.json").write_bytes((REPO / "langgraph.json").read_bytes())
    port = free_port()
    env = {**os.environ, "LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGSMITH_TRACING": "false", "PYTHONUNBUFFERED": "1"}
    with open(tmp_path / "langgraph-dev.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "langgraph_cli", "dev", "--host", "127.0.0.1", "--port",
                                 str(port), "--no-browser", "--no-reload", "--config", "langgraph.json"],
                                cwd=proj, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(url + "/ok", timeout=1) as r:
                    if json.loads(r.read()).get("ok"):
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("langgraph dev did not start:\n" + (tmp_path / "langgraph-dev.log").read_text()[-3000:])
            time.sleep(0.25)
        yield url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server's process group, by its PID
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def test_studio_runs_the_graph_to_the_review_and_resumes(studio, tmp_path):
    url, proc = studio
    client = get_sync_client(url=url)
    [assistant] = client.assistants.search(graph_id="mart")
    # the same graph as the CLI's, and a usable input schema
    nodes = {n["id"] for n in client.assistants.get_graph(assistant["assistant_id"])["nodes"]}
    assert nodes == set(compile_graph().get_graph().nodes)
    schemas = client.assistants.get_schemas(assistant["assistant_id"])
    schema = schemas["input_schema"]
    # the form's options are the typed TuneOptions (fields with descriptions), not a free-form object
    ref = schema["properties"]["options"].get("$ref", "")
    options_schema = schema.get("$defs", {}).get(ref.rsplit("/", 1)[-1]) if ref else schema["properties"]["options"]
    assert options_schema["properties"]["system_trials"]["type"] == "integer"
    assert "Stage-1 trial budget" in options_schema["properties"]["system_trials"]["description"]

    runs = tmp_path / "runs"
    options = {"backend": "tests.support.toy_backend:make_backend", "runs_dir": str(runs), "system_trials": 3,
               "learning_trials": 0, "system_horizon": 3, "watch_interval_s": 0.01, "quiet": True}
    thread = client.threads.create()
    tid = thread["thread_id"]
    client.runs.wait(tid, assistant["assistant_id"], input={"options": options})
    state = client.threads.get_state(tid)
    assert state["next"] == ["human_review"]
    [intr] = state["interrupts"]
    request = intr["value"]
    assert request["kind"] == "mart_review" and request["review_no"] == 1
    run_dir = Path(state["values"]["run_dir"])
    assert run_dir.parent == runs and run_dir.name == f"studio-{tid}"
    assert [t["kind"] for t in Ledger.open(run_dir).trials()] == ["baseline"]

    # a malformed answer is refused: the thread stays at the same review
    client.runs.wait(tid, assistant["assistant_id"], command={"resume": {"action": "maybe"}}, raise_error=False)
    state = client.threads.get_state(tid)
    assert state["next"] == ["human_review"] and len(Ledger.open(run_dir).trials()) == 1

    # Studio answers the interrupt itself; the graph moves on and a trial runs
    client.runs.wait(tid, assistant["assistant_id"],
                     command={"resume": {"action": "approve", "reviewer": "studio-user", "channel": "studio"}})
    state = client.threads.get_state(tid)
    trials = Ledger.open(run_dir).trials()
    assert len(trials) == 2 and trials[1]["candidate_id"] == only(request)["candidate_id"]
    [review] = Ledger.open(run_dir).table_rows("reviews")
    assert (review["action"], review["reviewer"], review["channel"]) == ("approve", "studio-user", "studio")
    assert state["next"] == ["human_review"] and state["interrupts"][0]["value"]["review_no"] == 2
    assert state["interrupts"][0]["id"] != intr["id"]
    assert proc.poll() is None


def test_studio_review_form_is_the_typed_decision_and_stale_or_invalid_answers_are_refused(studio, tmp_path):
    from pydantic import TypeAdapter

    from mart.state.models import ReviewDecision

    url, proc = studio
    client = get_sync_client(url=url)
    [assistant] = client.assistants.search(graph_id="mart")
    aid = assistant["assistant_id"]
    runs = tmp_path / "runs"
    options = {"backend": "tests.support.toy_backend:make_backend", "runs_dir": str(runs), "system_trials": 4,
               "learning_trials": 0, "system_horizon": 3, "watch_interval_s": 0.01, "quiet": True}
    tid = client.threads.create()["thread_id"]
    client.runs.wait(tid, aid, input={"options": options})
    state = client.threads.get_state(tid)
    [first] = state["interrupts"]
    # the form Studio renders for the review: the typed decision (approve / edit / reject / respond per candidate)
    schema = first["response_schema"]
    assert schema == TypeAdapter(ReviewDecision).json_schema()
    decision = schema["$defs"]["CandidateDecision"]["properties"]["type"]
    assert set(decision["enum"]) == {"approve", "edit", "reject", "respond"}
    run_dir = Path(state["values"]["run_dir"])

    def trials():
        return Ledger.open(run_dir).trials()

    # answer review #1 by its interrupt id; review #2 is asked
    client.runs.wait(tid, aid, command={"resume": {first["id"]: {"action": "approve", "reviewer": "ann"}}})
    [second] = client.threads.get_state(tid)["interrupts"]
    assert second["id"] != first["id"] and second["value"]["review_no"] == 2
    ran = len(trials())

    # a stale answer (review #1's id again, e.g. an old form): the server refuses it, nothing moves
    stale = client.runs.wait(tid, aid, command={"resume": {first["id"]: {"action": "approve"}}}, raise_error=False,
                             strict_resume=True)
    assert stale["__error__"]["error"] == "UnknownInterruptError"  # strict resume on Studio's server (graph/studio.py)
    assert client.runs.list(tid)[0]["status"] == "error"
    state = client.threads.get_state(tid)
    assert [i["id"] for i in state["interrupts"]] == [second["id"]] and len(trials()) == ran
    assert not Ledger.open(run_dir).table_rows("reviews")[1:]  # only review #1's decision was recorded

    # an edit of a key outside the catalogue: refused in band (the review is asked again, naming the key), no trial
    client.runs.wait(tid, aid, command={"resume": {second["id"]: {"action": "edit", "edits": {"bogus_knob": 3}}}})
    state = client.threads.get_state(tid)
    [again] = state["interrupts"]
    assert again["value"]["review_no"] == 2 and "bogus_knob" in (again["value"]["error"] or "")
    assert len(trials()) == ran and proc.poll() is None
