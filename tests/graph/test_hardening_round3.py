"""Issue 45: a stored handle proves nothing, a deadline is a deadline, a blob's cost is bounded, and the lower items.

Each test reproduces one case of the issue (each failed before the fix).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path

import psutil

from mart.state.models import config_hash
from tests.support.cli import cli


# -- 1. a handle planted in the ledger is not adopted, its process never signalled -------------------------------
def _paused_local_run(runs: Path) -> dict:
    out = cli("tune", "--backend", "local", "--approve", "none", "--runs-dir", str(runs), "--json", "-q",
              "--system-trials", "2", "--learning-trials", "0", "--system-horizon", "2", "--watch-interval-s", "0.05",
              "--no-report")
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def _pending_overrides(value) -> list[dict]:
    if isinstance(value, dict):
        if value.get("name") == "run_trial":
            return [value["args"]["overrides"]]
        return [c for v in value.values() for c in _pending_overrides(v)]
    if isinstance(value, list):
        return [c for v in value for c in _pending_overrides(v)]
    return []


def test_a_victims_handle_planted_in_the_next_trials_row_is_refused_and_the_victim_lives(tmp_path):
    runs = tmp_path / "runs"
    paused = _paused_local_run(runs)
    run_id = paused["run_id"]
    # predictable: the stage, the next sequence number, the pending candidate's overrides (nodes/human_review.py)
    [overrides] = _pending_overrides(paused)
    with sqlite3.connect(runs / run_id / "mart.sqlite") as db:
        [(done,)] = db.execute("SELECT COUNT(*) FROM trials").fetchall()
    next_id = f"sys-{done + 1:02d}-{config_hash(overrides)[:6]}"
    victim = subprocess.Popen(["sleep", "120"], start_new_session=True)  # leads its own group, like a trial
    try:
        created = psutil.Process(victim.pid).create_time()
        handle = {"trial_id": next_id, "backend": "local", "trial_dir": str(runs / run_id / "trials" / next_id),
                  "pid": victim.pid, "pid_create_time": created, "started_at": 0, "extra": {}}
        with sqlite3.connect(runs / run_id / "mart.sqlite") as db:
            db.execute("INSERT INTO trials (trial_id, run_id, seq, stage, kind, candidate_id, config, status, handle, "
                       "trial_dir, started_at, launch_token) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                       (next_id, run_id, 2, "system", "candidate", next_id, "{}", "running", json.dumps(handle),
                        handle["trial_dir"], 0, "0123456789abcdef"))
        out = cli("review", run_id, "--runs-dir", str(runs), "--approve")
        time.sleep(0.2)
        assert victim.poll() is None, "the planted victim was signalled"
        refusals = [line for line in out.output.splitlines() if "stored handle refused" in line]
        assert len(refusals) == 1, out.output
        assert next_id in refusals[0] and f"pid {victim.pid}" in refusals[0]
        assert "launch token" in refusals[0]
    finally:
        victim.kill()
        victim.wait()


# -- 2. --llm-timeout is a wall-clock deadline per request ------------------------------------------------------
def test_the_client_deadline_holds_against_a_slow_drip():
    import httpx
    import pytest

    from mart.nodes.agents.llm_client import capped_http_client
    from tests.support.openai_stub import OpenAIStub, Reply

    with OpenAIStub(default=lambda req: Reply.drip(0.5), max_lifetime_s=60) as stub:
        client = capped_http_client(deadline_s=2.0)
        start = time.monotonic()
        with pytest.raises(httpx.TimeoutException, match="deadline"):
            client.post(f"{stub.base_url}/chat/completions", json={"messages": []}, timeout=30)
        took = time.monotonic() - start
    assert took < 2.0 + 0.5, took  # per-read timeouts alone would have waited for all 1002 bytes (~500 s)


def test_a_slow_drip_endpoint_ends_each_request_at_the_deadline_and_the_session_completes(tmp_path, monkeypatch):
    from mart.state.ledger import Ledger
    from tests.support.cli import TOY
    from tests.support.openai_stub import OpenAIStub, Reply

    monkeypatch.setenv("MART_LLM_MAX_RETRIES", "0")  # one HTTP request per call: the call's latency is the request's
    monkeypatch.setenv("MART_LLM_MODEL", "stub-model")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with OpenAIStub(default=lambda req: Reply.drip(2.0), max_lifetime_s=200, max_hang_s=120) as stub:
        start = time.monotonic()
        out = cli("tune", "--backend", TOY, "--approve", "auto", "--runs-dir", str(tmp_path), "--json", "-q",
                  "--system-trials", "2", "--learning-trials", "0", "--system-horizon", "2",
                  "--watch-interval-s", "0.01", "--no-report", "--agents", "llm", "--llm-base-url", stub.base_url,
                  "--llm-timeout", "8")
        took = time.monotonic() - start
        requests = len(stub.completions())
    assert out.exit_code == 0, out.output
    summary = json.loads(out.stdout)
    assert summary["status"] == "completed"
    ledger = Ledger.open(tmp_path / summary["run_id"])
    calls = ledger.table_rows("agent_calls")
    ledger.close()
    llm = [c for c in calls if c["strategy"] == "llm"]
    assert len(llm) == requests > 0 and not any(c["ok"] for c in llm)
    assert all(7.9 <= c["latency_s"] <= 8 + 1.5 for c in llm), [c["latency_s"] for c in llm]
    assert any(c["strategy"] == "rules" and c["fallback_reason"] for c in calls)  # the rules agents took over
    assert took < requests * 9.5 + 30
