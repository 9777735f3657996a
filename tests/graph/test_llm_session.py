"""Whole sessions with the LLM agents behind a loopback OpenAI-compatible server.

The fast ones drive ``mart.graph.session.tune`` on the lead's instant toy backend; the slow one runs the real
``mart tune --agents llm --approve auto`` command line on the local workload.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.options import TuneOptions
from tests.support.openai_stub import OpenAIStub, PlausibleAgent, RecordedRequest, Reply
from tests.support.paths import REPO as REPO_ROOT

SECRET = "sk-session-secret-9f8e7d6c5b4a"
REPO = REPO_ROOT
TOY = "tests.support.toy_backend:make_backend"

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("clean_llm_env")]



def toy_options(tmp_path, base_url: str, **kw) -> TuneOptions:
    args = {"backend": TOY, "approve": "auto", "runs_dir": str(tmp_path), "system_trials": 3, "learning_trials": 2,
            "system_horizon": 5, "learning_horizon": 6, "watch_interval_s": 0.01, "quiet": True, "agents": "llm",
            "llm_model": "stub-model", "llm_base_url": base_url, "llm_timeout_s": 5, "llm_price_per_mtok": (0.5, 1.5)}
    args.update(kw)
    return TuneOptions(**args)


def assert_no_secret_on_disk(run_dir: Path) -> None:
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), f"the API key leaked into {path}"


def test_llm_session_completes_and_records_the_calls(tmp_path):
    with OpenAIStub(default=PlausibleAgent(seed=3), max_lifetime_s=100) as stub:
        summary = tune(toy_options(tmp_path, stub.base_url), api_key=SECRET)
        n_requests = len(stub.completions())
    assert summary["status"] == "completed"
    run_dir = tmp_path / summary["run_id"]
    ledger = Ledger.open(run_dir)
    calls = ledger.table_rows("agent_calls")
    assert len(calls) == n_requests > 0  # one row per LLM call (no fallback happened)
    assert {c["role"] for c in calls} == {"proposer", "critic"} and {c["strategy"] for c in calls} == {"llm"}
    assert all(c["prompt_tokens"] > 0 and c["completion_tokens"] > 0 and c["cost_usd"] > 0 for c in calls)
    # the candidates the reviewer saw came from the LLM, with its rationale
    proposals = ledger.table_rows("proposals")
    assert proposals and {p["source"] for p in proposals} == {"llm"}
    assert all(p["rationale"].startswith("stub: try") for p in proposals)
    critiques = ledger.table_rows("critiques")
    assert any(c["picked"] for c in critiques)
    # usage reaches the summary
    agents = summary["agents"]
    assert agents["calls"] == n_requests and agents["fallbacks"] == 0
    assert agents["prompt_tokens"] == sum(c["prompt_tokens"] for c in calls)
    assert agents["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls), abs=1e-6)
    ledger.close()
    assert_no_secret_on_disk(run_dir)


def test_broken_critic_answers_fall_back_to_rules_with_the_reason_in_the_ledger(tmp_path):
    agent = PlausibleAgent(seed=4)

    def answer(req: RecordedRequest) -> Reply:
        if req.schema_name == "VerdictSet":
            return Reply.text("The second candidate looks best to me.")  # prose, not JSON
        return agent(req)

    with OpenAIStub(default=answer, max_lifetime_s=100) as stub:
        summary = tune(toy_options(tmp_path, stub.base_url, learning_trials=0), api_key=SECRET)
    assert summary["status"] == "completed"
    ledger = Ledger.open(tmp_path / summary["run_id"])
    calls = ledger.table_rows("agent_calls")
    fallbacks = [c for c in calls if c["fallback_reason"]]
    assert fallbacks and all(c["role"] == "critic" and c["strategy"] == "rules" for c in fallbacks)
    assert all("still invalid after 2 repair rounds" in c["fallback_reason"] and "not valid JSON" in c["fallback_reason"]
               for c in fallbacks)
    failed = [c for c in calls if c["role"] == "critic" and c["strategy"] == "llm"]
    assert failed and not any(c["ok"] for c in failed)
    if "error" in failed[0]:  # the ledger keeps each failed call's validation errors once it has the column
        assert all("not valid JSON" in c["error"] for c in failed)
    assert summary["agents"]["fallbacks"] == len(fallbacks)
    critiques = ledger.table_rows("critiques")
    assert any("[rules critic: LLM answer still invalid" in c["reasons"] for c in critiques)
    ledger.close()


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_mart_tune_agents_llm_on_the_local_workload(tmp_path):
    """The full command line: `mart tune --agents llm --approve auto` on the local GRPO workload (stage 1's
    candidate is the LLM proposer's and critic's; stage 2's LLM path is the toy sessions' above)."""
    if importlib.util.find_spec("mart.trial_runner.local.backend") is None:
        pytest.skip("the local backend (mart.trial_runner.local.backend) is not there yet")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MART_LLM_"))}
    keyfile = tmp_path / "key"  # never on the command line (the process list shows argv)
    keyfile.write_text(SECRET + "\n")
    runs = tmp_path / "runs"
    # a few minutes on an idle 2-core box; the bounds leave room for a box shared with other jobs
    with OpenAIStub(default=PlausibleAgent(seed=5), max_lifetime_s=950) as stub:
        cmd = [sys.executable, "-m", "mart.graph.cli", "tune", "--backend", "local", "--agents", "llm",
               "--approve", "auto", "--system-trials", "2", "--learning-trials", "0", "--system-horizon", "4",
               "--llm-model", "stub-model", "--llm-base-url", stub.base_url,
               "--llm-api-key-file", str(keyfile), "--runs-dir", str(runs), "--json", "--quiet"]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
        n_requests = len(stub.completions())
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["status"] == "completed"
    assert SECRET not in proc.stdout and SECRET not in proc.stderr
    assert all(SECRET in r.headers.get("authorization", "")
               for r in stub.completions())  # the key from the file was used
    run_dir = runs / summary["run_id"]
    ledger = Ledger.open(run_dir)
    calls = ledger.table_rows("agent_calls")
    llm_calls = [c for c in calls if c["strategy"] == "llm"]
    assert len(llm_calls) == n_requests > 0
    assert {c["role"] for c in llm_calls} == {"proposer", "critic"}
    assert all(c["prompt_tokens"] > 0 for c in llm_calls)
    # every fallback carries its reason
    assert all(c["fallback_reason"] for c in calls if c["strategy"] != "llm")
    proposals = ledger.table_rows("proposals")
    assert any(p["source"] == "llm" for p in proposals)
    ledger.close()
    assert_no_secret_on_disk(run_dir)
