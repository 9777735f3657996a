"""Issue 26 item 1: an endpoint named by a run folder gets no credential unless the user names it again.

A run whose stored options name ``llm_base_url`` (LLM agents) or a backend ``ray_address`` was continued with
``Authorization: Bearer <the user's OPENAI_API_KEY / RAY_AUTH_TOKEN>`` sent to that address. Like a stored
plugin, a stored endpoint is used only when the user names it in this process (``--llm-base-url`` /
``--ray-address`` again, ``$OPENAI_BASE_URL`` / ``$RAY_ADDRESS``, an allow-list) or trusts the folder.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mart.graph.session import UntrustedRun, resume, tune
from mart.state.models import ReviewDecision
from mart.state.options import TuneOptions
from tests.support.openai_stub import OpenAIStub, PlausibleAgent

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("clean_llm_env")]
TOY = "tests.support.toy_backend:make_backend"
KEY = "sk-user-own-key-0123456789abcdef"
APPROVE = ReviewDecision(action="approve", reviewer="test", channel="test")


def cli(*args: str):
    from typer.testing import CliRunner

    from mart.graph.cli import app

    return CliRunner().invoke(app, list(args))


def paused_llm_run(tmp_path, base_url: str) -> str:
    # three system trials: answering review #1 leads to another proposal round (an LLM call)
    out = tune(TuneOptions(backend=TOY, approve="none", runs_dir=str(tmp_path), system_trials=3, learning_trials=0,
                           system_horizon=2, watch_interval_s=0.01, quiet=True, agents="llm", llm_model="stub",
                           llm_base_url=base_url, llm_timeout_s=5), api_key="sk-during-the-first-session")
    assert out["status"] == "paused"
    return out["run_id"]


def restore_options(tmp_path, run: str, **changes) -> None:
    db = sqlite3.connect(tmp_path / run / "mart.sqlite")
    stored = json.loads(db.execute("SELECT options FROM runs").fetchone()[0])
    for k, v in changes.items():
        if k == "backend_options":
            stored[k] = {**stored[k], **v}
        else:
            stored[k] = v
    db.execute("UPDATE runs SET options = ?", (json.dumps(stored),))
    db.commit()
    db.close()


def test_a_stored_llm_url_gets_no_key_unless_named_again(tmp_path, monkeypatch):
    with OpenAIStub(default=PlausibleAgent(seed=1), max_lifetime_s=60) as honest, \
            OpenAIStub(default=PlausibleAgent(seed=2), max_lifetime_s=60) as evil:
        run = paused_llm_run(tmp_path, honest.base_url)
        restore_options(tmp_path, run, llm_base_url=evil.base_url)  # crafted: the folder now names another URL
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        with pytest.raises(UntrustedRun, match="llm_base_url"):
            resume(run, tmp_path, decision=APPROVE, quiet=True)
        out = cli("review", run, "--runs-dir", str(tmp_path), "--approve")
        assert out.exit_code == 2 and "--llm-base-url" in out.stderr and "Traceback" not in out.stderr
        out = cli("resume", run, "--runs-dir", str(tmp_path))
        assert out.exit_code == 2 and evil.base_url in out.stderr
        assert evil.requests == []  # nothing was sent there, let alone the key
        # the user names the endpoint again (flag, or $OPENAI_BASE_URL): now it is theirs to use
        out = cli("review", run, "--runs-dir", str(tmp_path), "--approve", "--llm-base-url", evil.base_url, "-q")
        assert out.exit_code == 0, out.stderr
        assert evil.requests and all(r.headers.get("authorization") == f"Bearer {KEY}" for r in evil.requests)


def test_a_stored_llm_url_named_by_the_environment_or_trusted_runs(tmp_path, monkeypatch):
    with OpenAIStub(default=PlausibleAgent(seed=1), max_lifetime_s=60) as stub:
        run = paused_llm_run(tmp_path, stub.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
        assert resume(run, tmp_path, decision=APPROVE, quiet=True, approve="none")["status"] in ("paused", "completed")
        monkeypatch.delenv("OPENAI_BASE_URL")
        run2 = paused_llm_run(tmp_path / "b", stub.base_url)
        assert resume(run2, tmp_path / "b", decision=APPROVE, quiet=True, trust=True, approve="none")["status"] in \
            ("paused", "completed")


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        self.send_response(404)
        self.end_headers()

    do_POST = do_GET


def test_a_stored_ray_address_gets_no_token_unless_named_again(tmp_path, monkeypatch):
    from tests.graph.test_hardening import paused_run

    run = paused_run(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        # crafted: a builtin backend, sending its trials to a "cluster" the folder names
        restore_options(tmp_path, run, backend="local", backend_options={"ray_address": address})
        monkeypatch.setenv("RAY_AUTH_TOKEN", "ray-user-token-secret")
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        with pytest.raises(UntrustedRun, match="ray_address"):
            resume(run, tmp_path, decision=APPROVE, quiet=True)
        out = cli("review", run, "--runs-dir", str(tmp_path), "--approve")
        assert out.exit_code == 2 and "--ray-address" in out.stderr
        assert _Recorder.seen == []
        # named again: the refusal is lifted (what happens next is the cluster's business)
        from mart.graph.session import load_options
        from mart.state.run_store import RunStore

        store = RunStore.open(run, tmp_path)
        try:
            assert load_options(store, allowed={address}).backend_options["ray_address"] == address
            monkeypatch.setenv("RAY_ADDRESS", address)
            assert load_options(store).backend_options["ray_address"] == address
        finally:
            store.close()
    finally:
        server.shutdown()
