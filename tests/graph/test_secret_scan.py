"""Issue 26's secret scan: fake secrets in the environment, a session through every channel that can reach
them, and not one copy anywhere mart writes or passes on.

Channels: ``mart import-verl`` of a script whose overrides name ``$OPENAI_API_KEY``, ``${SLACK_BOT_TOKEN}`` and
``$RAY_AUTH_TOKEN``; the session on that base config (the verl backend, the stand-in behind a wrapper that
records each trial's environment and argv); LLM agents against the local OpenAI stub, which echoes the
``Authorization`` header it got into its answers; reviews posted to the local Slack stub; ``mart review`` from
the command line; the report. Scanned: every file under the runs folder (SQLite and its WAL included, trial
logs, ``launch.json``, the trials' recorded environment and argv, the reports), the base config, every
command's stdout and stderr, and what the two stubs received in their bodies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.openai_stub import OpenAIStub, PlausibleAgent, RecordedRequest, Reply
from tests.support.paths import FAKE_VERL, REPO
from tests.support.slack_stub import SlackStub

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SECRETS = {
    "OPENAI_API_KEY": "sk-scan-openai-7f3a9c1e5b",
    "ANTHROPIC_API_KEY": "sk-ant-scan-2b8d4f6a0c",
    "AZURE_OPENAI_API_KEY": "az-scan-9e1c3a5b7d",
    "SLACK_BOT_TOKEN": "xoxb-scan-4d6f8a0c2e",
    "SLACK_SIGNING_SECRET": "slack-signing-scan-1a3c5e",
    "SLACK_APP_TOKEN": "xapp-scan-6b8d0f2a4c",
    "RAY_AUTH_TOKEN": "ray-scan-3e5a7c9b1d",
}

WRAPPER = """import json, os, runpy, sys
# the trial's own view: its environment and argv, written where it runs (inside the run folder)
json.dump({"env": dict(os.environ), "argv": sys.argv}, open("trial_seen.json", "w"))
sys.argv = [%r] + sys.argv[1:]
runpy.run_path(%r, run_name="__main__")
""" % (str(FAKE_VERL), str(FAKE_VERL))

SCRIPT = """#!/bin/bash
KEY=$OPENAI_API_KEY
python3 -m verl.trainer.main_ppo \\
    +fake.step_s=0.02 \\
    data.train_batch_size=256 \\
    +custom.llm_key=$KEY \\
    +custom.slack="${SLACK_BOT_TOKEN}" \\
    +custom.ray=${RAY_AUTH_TOKEN:-none} \\
    "$@"
"""


def echoing_agent() -> object:
    plausible = PlausibleAgent(seed=3)

    def answer(req: RecordedRequest) -> Reply:
        reply = plausible(req)
        echo = f"I was called with {req.headers.get('authorization')} and the key is {SECRETS['OPENAI_API_KEY']}"
        if isinstance(reply.content, dict):
            for field in ("analysis", "summary"):
                if field in reply.content:
                    reply.content[field] = echo
            for cand in reply.content.get("candidates") or []:
                if isinstance(cand, dict) and "rationale" in cand:
                    cand["rationale"] = echo
        return reply

    return answer


def mart(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "mart.graph.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=240)
    return proc


def test_no_secret_reaches_disk_logs_argv_or_a_trial(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "MART_", "SLACK_", "RAY_"))},
           **SECRETS}
    outputs: list[str] = []
    script = tmp_path / "run_grpo.sh"
    script.write_text(SCRIPT)
    base = tmp_path / "base.yaml"
    proc = mart("import-verl", str(script), "-o", str(base), env=env)
    outputs += [proc.stdout, proc.stderr]
    assert proc.returncode == 0, proc.stderr
    wrapper = tmp_path / "verl_wrapper.py"
    wrapper.write_text(WRAPPER)
    entry = f"{sys.executable} {wrapper}"
    runs = tmp_path / "runs"
    with OpenAIStub(default=echoing_agent(), max_lifetime_s=240) as llm, \
            SlackStub(SECRETS["SLACK_BOT_TOKEN"]) as slack:
        env = {**env, "MART_SLACK_API_URL": slack.api_url, "MART_SLACK_CHANNEL": "C0SCAN"}
        common = ["--runs-dir", str(runs)]
        proc = mart("tune", "--backend", "verl", "--verl-entrypoint", entry, "--base-config", str(base),
                    "--backend-option", "prevalidate=false", "--memory-capacity-gb", "80", "--system-trials", "2",
                    "--learning-trials", "2", "--learning-confirm-trials", "0", "--system-horizon", "2",
                    "--learning-horizon", "2", "--agents", "llm", "--llm-model", "stub", "--llm-base-url",
                    llm.base_url, "--approve", "slack", "--watch-interval-s", "0.05", *common, env=env)
        outputs += [proc.stdout, proc.stderr]
        assert proc.returncode == 0, proc.stderr
        run = next(p.name for p in runs.iterdir() if not p.name.startswith("."))
        for _ in range(4):  # answer each review from the command line until the session completes
            proc = mart("review", run, "--approve", "--detach", "--verl-entrypoint", entry, "--llm-base-url",
                        llm.base_url, "--json", *common, env=env)
            outputs += [proc.stdout, proc.stderr]
            if proc.returncode != 0 or json.loads(proc.stdout).get("status") == "completed":
                break
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["status"] == "completed"
        proc = mart("report", run, "--format", "md", *common, env=env)
        outputs += [proc.stdout, proc.stderr]
        proc = mart("export", run, *common, env=env)
        outputs += [proc.stdout, proc.stderr]
        llm_bodies = [json.dumps(r.body) for r in llm.requests]
        slack_bodies = [json.dumps(c.get("params")) for c in slack.calls]
    assert llm_bodies and slack_bodies  # both channels were used
    seen = list((runs / run / "trials").rglob("trial_seen.json"))
    assert len(seen) >= 4  # every trial recorded what it got
    for f in seen:
        data = json.loads(f.read_text())
        assert not set(SECRETS) & set(data["env"]), sorted(set(SECRETS) & set(data["env"]))
    files = {str(p): p.read_bytes() for p in [*runs.rglob("*"), base] if p.is_file()}
    assert any(n.endswith("report.html") for n in files) and any(n.endswith("mart.sqlite") for n in files)
    copies = []
    for name, secret in SECRETS.items():
        for path, data in files.items():
            if secret.encode() in data:
                copies.append(f"{name} in {path}")
        for i, text in enumerate(outputs + llm_bodies + slack_bodies):
            if secret in text:
                copies.append(f"{name} in output #{i}")
    assert copies == []
    assert "${oc.env:OPENAI_API_KEY}" in base.read_text()  # the import kept a reference, not the value
