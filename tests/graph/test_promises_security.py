"""Issue 28's security and durability promises, each held by a test that fails when the promise is broken.

(C1 controls: ``tests/graph/test_output_escaping.py::test_c1_controls_are_dropped_for_the_terminal_and_slack``;
export shell quoting: ``test_output_escaping.py::test_schedule_script_quotes_every_stored_field``.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from mart.graph.session import UntrustedRun, resume
from mart.state.run_store import RunOutsideRunsDir, RunStore
from tests.graph.test_hardening import APPROVE, cli, paused_run, set_stored_options
from tests.support.paths import REPO

pytestmark = pytest.mark.timeout(120)


def test_stored_runner_options_never_run_without_trust(tmp_path):
    run = paused_run(tmp_path)
    stored = json.loads(__import__("sqlite3").connect(tmp_path / run / "mart.sqlite")
                        .execute("SELECT options FROM runs").fetchone()[0])
    crafted = {**stored, "backend": "verl", "backend_options": {"runner_options": {"env": {"LD_PRELOAD": "/x.so"}}}}
    set_stored_options(tmp_path, run, crafted)
    with pytest.raises(UntrustedRun, match="runner_options"):
        resume(run, tmp_path, decision=APPROVE, quiet=True)
    out = cli("review", run, "--runs-dir", str(tmp_path), "--approve")
    assert out.exit_code == 2 and "runner_options" in out.stderr and "--trust-run" in out.stderr


MART_SECRETS = {"OPENAI_API_KEY": "sk-a", "ANTHROPIC_API_KEY": "sk-ant-b", "AZURE_OPENAI_API_KEY": "az-c",
                "RAY_AUTH_TOKEN": "ray-d", "RAY_AUTH_TOKEN_PATH": "/tmp/ray-token", "SLACK_BOT_TOKEN": "xoxb-e",
                "MART_SLACK_CHANNEL": "C0SECRET", "MART_SLACK_REVIEWERS": "U0SECRET", "MART_LLM_MODEL": "gpt-x",
                "MART_LLM_API_BASE": "https://llm.internal"}


def test_trial_processes_inherit_none_of_marts_secrets(tmp_path, monkeypatch):
    from mart.state.trials import TrialSpec
    from mart.trial_runner.base import trial_env
    from mart.trial_runner.local.runner import LocalRunner

    for k, v in MART_SECRETS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HF_TOKEN", "hf-keep")
    monkeypatch.setenv("WANDB_API_KEY", "wandb-keep")
    assert not set(MART_SECRETS) & set(trial_env())
    # and in a real trial process
    runner = LocalRunner()
    script = tmp_path / "dump.py"
    out = tmp_path / "env.json"
    script.write_text("import json, os, sys; json.dump(dict(os.environ), open(sys.argv[-1] + '.tmp', 'w')); "
                      "os.replace(sys.argv[-1] + '.tmp', sys.argv[-1])")
    runner.build_command = lambda spec: [sys.executable, str(script), str(out)]
    runner.write_config = lambda spec: None
    (tmp_path / "t").mkdir()
    runner.launch(TrialSpec(trial_id="t", trial_dir=str(tmp_path / "t"), steps=1, config={}, seed=0))
    deadline = time.monotonic() + 30
    while not out.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    env = json.loads(out.read_text())
    assert sorted(set(MART_SECRETS) & set(env)) == []
    assert env["HF_TOKEN"] == "hf-keep" and env["WANDB_API_KEY"] == "wandb-keep"  # a job's own secrets pass


def test_runs_dir_containment_is_by_path_not_by_prefix(tmp_path):
    runs, evil = tmp_path / "runs", tmp_path / "runs-evil"
    runs.mkdir()
    run = paused_run(evil)  # a sibling whose name starts with the runs dir's
    with pytest.raises(RunOutsideRunsDir):
        RunStore.open(str(evil / run), runs)
    with pytest.raises(RunOutsideRunsDir):
        RunStore.open(f"{runs}-evil/{run}", runs)
    out = cli("resume", str(evil / run), "--runs-dir", str(runs))
    assert out.exit_code == 2 and "--runs-dir" in out.stderr
    nested = runs / "sub"
    nested.mkdir()
    run2 = paused_run(nested)  # deeper inside the runs dir is not a run of it either
    with pytest.raises(RunOutsideRunsDir):
        RunStore.open(str(nested / run2), runs)


_KILLED_CREATE = r"""
import os, sys
from mart.state import ledger
real = ledger.Ledger.upsert_run
def killed(self, *a, **kw):
    real(self, *a, **kw)  # the database and its row exist, then the process dies before the folder is complete
    os._exit(9)
ledger.Ledger.upsert_run = killed
from mart.state.run_store import RunStore
RunStore.create(sys.argv[1], "r1", options={"backend": "local"})
"""


def test_run_creation_is_atomic_under_a_kill(tmp_path):
    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-c", _KILLED_CREATE, str(runs)], cwd=REPO, capture_output=True,
                          timeout=60)
    assert proc.returncode == 9, proc.stderr
    visible = [p.name for p in runs.iterdir() if not p.name.startswith(".")]
    assert visible == []  # no run folder without its database and options, for status or resume to trip on
    out = cli("status", "--runs-dir", str(runs))
    assert out.exit_code == 0 and "no runs" in out.stdout
    assert RunStore.create(runs, "r1", options={"backend": "local"}).run_dir.name == "r1"  # the id is free
    assert os.path.isdir(runs / "r1")


def test_an_answer_to_a_review_no_longer_pending_changes_nothing(tmp_path):
    # Slack delivers a click twice (or two reviewers click): the second answer names a review already
    # decided and must not be applied to the review asked since
    from mart.graph.session import StaleReview, pending_review

    run = paused_run(tmp_path, system_trials=3)
    store = RunStore.open(run, tmp_path)
    first = pending_review(store)["interrupt_id"]
    store.close()
    out = resume(run, tmp_path, decision=APPROVE, interrupt_id=first, quiet=True)
    assert out["status"] == "paused"  # the next review is pending: the setup this test needs
    second = out["pending_review"]["interrupt_id"]
    assert second != first
    trials = len(__import__("sqlite3").connect(tmp_path / run / "mart.sqlite")
                 .execute("SELECT trial_id FROM trials").fetchall())
    for stale in (first, "no-such-review"):
        with pytest.raises(StaleReview, match="no longer pending"):
            resume(run, tmp_path, decision=APPROVE, interrupt_id=stale, quiet=True)
        store = RunStore.open(run, tmp_path)
        assert pending_review(store)["interrupt_id"] == second  # still asked, not answered by the stale click
        store.close()
    assert len(__import__("sqlite3").connect(tmp_path / run / "mart.sqlite")
               .execute("SELECT trial_id FROM trials").fetchall()) == trials  # nothing launched
