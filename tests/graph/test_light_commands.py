"""The answers that must come at once (issue 47: `mart status`, a refused `mart review --edit`, a refused `mart tune
--set`) import none of the heavy libraries they do not need: LangGraph pulls in LangChain and LangSmith (seconds),
sqlite_utils would pull in pandas (0.9 s), Hydra (0.5 s) is needed only to parse a KEY=VALUE. A guard on what is
imported, not a timed test: import times depend on the machine's load, the modules loaded do not."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.cli import TOY, paused_toy_run
from tests.support.paths import REPO
from tests.support.toy_backend import MB

HEAVY = {"langgraph", "langchain_core", "langsmith", "pandas", "matplotlib"}


def _run_cli(*args: str) -> dict:
    """The command in a fresh interpreter: its exit code, output, and the top-level packages it imported."""
    code = ("import json, sys\nfrom typer.testing import CliRunner\nfrom mart.graph.cli import app\n"
            f"r = CliRunner().invoke(app, {list(args)!r})\n"
            "print(json.dumps({'code': r.exit_code, 'out': r.output, "
            "'mods': sorted({m.split('.')[0] for m in sys.modules})}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_status_and_refusals_import_no_heavy_library(tmp_path):
    runs = str(tmp_path / "runs")
    run = paused_toy_run(runs)["run_id"]

    status = _run_cli("status", run, "--runs-dir", runs)
    assert status["code"] == 0 and "paused" in status["out"], status["out"]
    assert HEAVY & set(status["mods"]) == set()
    assert "hydra" not in status["mods"]  # no KEY=VALUE to parse

    refused = _run_cli("review", run, "--runs-dir", runs, "--backend", TOY, "--edit", f"{MB}=abc")
    assert refused["code"] == 2 and "must be" in refused["out"] and "abc" in refused["out"], refused["out"]
    assert HEAVY & set(refused["mods"]) == set()
    # the refusal changed nothing: the same review is still pending
    assert "pending review" in _run_cli("status", run, "--runs-dir", runs)["out"]

    bad_set = _run_cli("tune", "--backend", "local", "--runs-dir", str(tmp_path / "new"), "--set", "lr=abc")
    assert bad_set["code"] == 2 and "--set lr" in bad_set["out"], bad_set["out"]
    assert HEAVY & set(bad_set["mods"]) == set()
    assert not (tmp_path / "new").exists() or not any((tmp_path / "new").iterdir())  # refused before a run exists


def test_a_valid_edit_still_goes_through_the_graph(tmp_path):
    """The early check of an edit's values refuses nothing the review node accepts: a valid edit runs."""
    runs = str(tmp_path / "runs")
    run = paused_toy_run(runs)["run_id"]
    ok = _run_cli("review", run, "--runs-dir", runs, "--backend", TOY, "--edit", f"{MB}=4", "--detach", "--json", "-q")
    assert ok["code"] == 0, ok["out"]
    assert "langgraph" in ok["mods"]  # the decision reached the graph
