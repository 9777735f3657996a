"""Issue 17: a run folder, LLM text, trial logs and the environment are untrusted input.

Each test here reproduces one attack or careless-user case from the issue (they failed before the fix).
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mart.graph.progress_console import ConsoleProgress
from mart.graph.session import UntrustedRun, resume, tune
from mart.state.models import ReviewDecision
from mart.state.options import TuneOptions
from mart.state.run_store import RunError, RunOutsideRunsDir, RunStore
from tests.support.paths import REPO
from tests.support.reviews import only

TOY = "tests.support.toy_backend:make_backend"
APPROVE = ReviewDecision(action="approve", reviewer="test", channel="test")


def paused_run(tmp_path, **kw) -> str:
    opts = dict(backend=TOY, approve="none", runs_dir=str(tmp_path), system_trials=2, learning_trials=0,
                system_horizon=2, watch_interval_s=0.01, quiet=True)
    opts.update(kw)
    out = tune(TuneOptions(**opts))
    assert out["status"] == "paused"
    return out["run_id"]


def cli(*args: str, stdin: str | None = None):
    from typer.testing import CliRunner

    from mart.graph.cli import app

    return CliRunner().invoke(app, list(args), input=stdin)


def set_stored_options(tmp_path, run: str, options) -> None:
    conn = sqlite3.connect(tmp_path / run / "mart.sqlite")
    conn.execute("UPDATE runs SET options = ?", (options if isinstance(options, str) else json.dumps(options),))
    conn.commit()
    conn.close()


# -- 1. a crafted run folder must not run code ------------------------------------------------------
def test_crafted_plugin_backend_in_a_run_folder_is_refused(tmp_path, monkeypatch):
    run = paused_run(tmp_path)
    marker = tmp_path / "pwned"
    row = sqlite3.connect(tmp_path / run / "mart.sqlite").execute("SELECT options FROM runs").fetchone()
    crafted = {**json.loads(row[0]), "backend": "os:system", "backend_options": {"command": f"touch {marker}"}}
    set_stored_options(tmp_path, run, crafted)
    with pytest.raises(UntrustedRun, match="os:system"):
        resume(run, tmp_path, decision=APPROVE, quiet=True)
    out = cli("review", run, "--runs-dir", str(tmp_path), "--approve")
    assert out.exit_code == 2 and "--trust-run" in out.stderr
    out = cli("resume", run, "--runs-dir", str(tmp_path))
    assert out.exit_code == 2 and "os:system" in out.stderr
    assert not marker.exists()
    # a launch command in a builtin backend's options is code too
    set_stored_options(tmp_path, run, {**crafted, "backend": "verl", "backend_options": {"entrypoint": f"touch {marker}"}})
    with pytest.raises(UntrustedRun, match="launch command"):
        resume(run, tmp_path, decision=APPROVE, quiet=True)
    set_stored_options(tmp_path, run, {**crafted, "backend": "verl", "backend_options": {"verl_python": "/tmp/x"}})
    with pytest.raises(UntrustedRun, match="verl_python"):
        resume(run, tmp_path, decision=APPROVE, quiet=True)
    assert not marker.exists()


def test_a_plugin_run_resumes_when_its_backend_is_given_again(tmp_path, monkeypatch):
    run = paused_run(tmp_path)
    monkeypatch.delenv("MART_ALLOWED_BACKENDS")
    with pytest.raises(UntrustedRun):
        resume(run, tmp_path, decision=APPROVE, quiet=True)
    out = cli("review", run, "--runs-dir", str(tmp_path), "--approve", "--backend", TOY, "-q", "--json")
    assert out.exit_code == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "completed"


def test_studio_and_notebook_runs_take_the_servers_allow_list(tmp_path, monkeypatch):
    from mart.graph.services import _services_from_state

    monkeypatch.setenv("MART_ALLOWED_BACKENDS", "")
    store = RunStore.create(tmp_path, "studio-x")
    with pytest.raises(ValueError, match="MART_ALLOWED_BACKENDS"):
        _services_from_state(TuneOptions(backend="os:system", runs_dir=str(tmp_path)), store)
    store.close()


def test_runs_resolve_only_inside_the_runs_dir(tmp_path):
    runs, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    runs.mkdir()
    run = paused_run(elsewhere)
    with pytest.raises(RunOutsideRunsDir):
        RunStore.open(str(elsewhere / run), runs)
    with pytest.raises(RunError):
        RunStore.open(f"../elsewhere/{run}", runs)
    (runs / "link").symlink_to(elsewhere / run)
    with pytest.raises(RunOutsideRunsDir):
        RunStore.open("link", runs)
    assert RunStore.open(run, elsewhere).run_id == run
    assert RunStore.open(str(elsewhere / run), runs, readonly=True).run_id == run  # a look is fine


def test_slack_server_refuses_a_crafted_run_before_showing_it_decided(tmp_path):
    from mart.graph.session import pending_review
    from mart.graph.slack_service import SlackReviewService

    run = paused_run(tmp_path)
    store = RunStore.open(run, tmp_path)
    interrupt = pending_review(store)["interrupt_id"]
    store.close()
    row = sqlite3.connect(tmp_path / run / "mart.sqlite").execute("SELECT options FROM runs").fetchone()
    set_stored_options(tmp_path, run, {**json.loads(row[0]), "backend": "os:system"})
    from slack_sdk import WebClient

    service = SlackReviewService(tmp_path, signing_secret="s", reviewers={"U1"}, client=WebClient(token="xoxb-t"),
                                 token_verification=False, allowed_backends=())
    request, note = service.check({"run": run, "interrupt": interrupt, "review": 1})
    assert request is None and "os:system" in note


# -- 2. foreign text never crashes rich -------------------------------------------------------------
BRACKETS = "FileNotFoundError: [Errno 2] No such file [/data/gsm8k/train.parquet] [bold]x[/bold"


def test_bracketed_trial_and_llm_text_prints_as_is():
    progress = ConsoleProgress(quiet=False)
    from rich.console import Console

    progress.console = Console(file=io.StringIO(), width=300)
    for event in ({"event": "trial_failed", "trial_id": "t[/x]", "reason": BRACKETS},
                  {"event": "health", "trial_id": "t1", "severity": "stop", "rule": "[/r]", "message": BRACKETS},
                  {"event": "trial_stopped", "trial_id": "t1", "reason": BRACKETS, "status": "failed"},
                  {"event": "critique", "pick": None, "feedback": BRACKETS},
                  {"event": "trial_done", "trial_id": "t1", "status": "failed", "eligible": False, "reason": BRACKETS}):
        from mart.nodes.progress import parse_event

        event = parse_event(event)
        progress(event)
    text = progress.console.file.getvalue()
    assert text.count("[/data/gsm8k/train.parquet]") == 5 and "[/r]" in text and "[bold]x[/bold" in text


def test_summary_with_bracketed_notes_and_configs_prints(capsys):
    from mart.graph.cli.output import print_summary

    print_summary({"run_id": "r[/x]", "status": "completed", "notes": [BRACKETS],
                    "system": {"baseline_throughput": 1.0, "best_throughput": 2.0, "throughput_gain_pct": 100.0,
                               "best_config": {"k": "[/v]"}, "memory_limit_gb": 1.0, "best_peak_memory_gb": 0.5},
                    "learning": {"baseline_score": None, "best_score": None, "score_gain": None, "best_config": None},
                    "trials": {"total": 1, "early_stopped": 0, "failed": 0}})
    out = capsys.readouterr().out
    assert "[/data/gsm8k/train.parquet]" in out and "[/v]" in out


# -- 3. what a reviewer sees cannot be faked --------------------------------------------------------
EVIL = "fine\x1b]0;owned\x07\x1b[2J\x1b[1;1Hall \u202egood\r<!channel> see <https://evil.example|docs> & <@U999>"


def evil_request() -> dict:
    return {"run_id": "r1", "review_no": 1, "stage": "system", "candidate_id": "c1", "source": "llm",
            "interrupt_id": "i1", "diff": [{"key": "k", "current": 1, "proposed": "<!here>"}], "rationale": EVIL,
            "critique": {"risk": "low", "reasons": [EVIL]}, "error": EVIL, "overrides": {"k": 2}}


def test_terminal_review_has_no_control_characters():
    from mart.graph.reviewers.base import TTYReviewer, format_request

    text = format_request(evil_request())
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text and "\r" not in text
    out = io.StringIO()
    TTYReviewer(stdin=io.StringIO("d\n"), stdout=out).review(evil_request())
    assert "\x1b" not in out.getvalue()


def test_slack_message_escapes_mentions_and_links():
    from mart.graph.reviewers.slack_blocks import decided_blocks, decision_modal, review_blocks

    decision = ReviewDecision(action="reject", feedback="<!channel> go", reviewer="x", channel="slack")
    blob = json.dumps([review_blocks(evil_request()), decided_blocks(evil_request(), decision, "U1"),
                       decision_modal("edit", {"run": "r1"}, evil_request())])
    for raw in ("<!channel>", "<!here>", "<https://evil", "<@U999>", "\\u001b"):
        assert raw not in blob
    assert "&lt;!channel&gt;" in blob and "&amp;" in blob


# -- 4. a scripted approval applies only to the review it was meant for -----------------------------
def test_review_approve_is_pinned_to_the_review_number(tmp_path):
    run = paused_run(tmp_path)
    store = RunStore.open(run, tmp_path)
    from mart.graph.session import pending_review

    before = pending_review(store)
    store.close()
    out = cli("review", run, "--runs-dir", str(tmp_path), "--approve", "--review", "2")
    assert out.exit_code == 2 and "#1, not #2" in out.stderr
    out = cli("review", run, "--runs-dir", str(tmp_path), "--approve", "--interrupt", "nope")
    assert out.exit_code == 2
    store = RunStore.open(run, tmp_path)
    assert pending_review(store)["interrupt_id"] == before["interrupt_id"]  # nothing changed
    store.close()
    out = cli("review", run, "--runs-dir", str(tmp_path), "--approve", "--review", "1", "-q")
    assert out.exit_code == 0, out.stderr
    assert only(before)["candidate_id"] in out.stdout and "approve" in out.stdout


# -- 7. secrets ---------------------------------------------------------------------------------------
def test_api_key_is_refused_on_the_command_line(tmp_path):
    out = cli("tune", "--llm-api-key", "sk-secret", "--runs-dir", str(tmp_path))
    assert out.exit_code == 2 and "OPENAI_API_KEY" in out.stderr
    assert not any(tmp_path.iterdir())
    keyfile = tmp_path / "key"
    keyfile.write_text("")
    out = cli("tune", "--llm-api-key-file", str(keyfile), "--runs-dir", str(tmp_path / "runs"))
    assert out.exit_code == 2 and "empty" in out.stderr


def test_base_url_userinfo_is_never_stored(tmp_path):
    run = paused_run(tmp_path, llm_base_url="https://alice:hunter2@llm.example:8443/v1")
    data = (tmp_path / run / "mart.sqlite").read_bytes()
    assert b"hunter2" not in data and b"alice" not in data
    assert TuneOptions(llm_base_url="https://alice:hunter2@llm.example:8443/v1").llm_base_url == \
        "https://llm.example:8443/v1"


def test_trial_processes_get_no_mart_secrets(tmp_path, monkeypatch):
    from mart.state.trials import TrialSpec
    from mart.trial_runner.local.runner import LocalRunner

    secrets = {"OPENAI_API_KEY": "sk-1", "SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s",
               "SLACK_APP_TOKEN": "xapp-1", "RAY_AUTH_TOKEN": "r"}
    for k, v in secrets.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HF_TOKEN", "hf-keep")
    runner = LocalRunner(python=sys.executable)
    script = tmp_path / "dump.py"
    script.write_text("import json, os, sys; json.dump(dict(os.environ), open(sys.argv[-1], 'w'))")
    runner.build_command = lambda spec: [sys.executable, str(script), str(tmp_path / "env.json")]
    runner.write_config = lambda spec: None
    trial_dir = tmp_path / "t"
    trial_dir.mkdir()
    spec = TrialSpec(trial_id="t", trial_dir=str(trial_dir), steps=1, config={}, seed=0)
    runner.launch(spec)
    deadline = time.monotonic() + 30
    while not (tmp_path / "env.json").exists() or not (tmp_path / "env.json").read_text().endswith("}"):
        assert time.monotonic() < deadline, "the trial process did not write its environment"
        time.sleep(0.05)
    time.sleep(0.1)
    env = json.loads((tmp_path / "env.json").read_text())
    assert not set(secrets) & set(env)
    assert env["HF_TOKEN"] == "hf-keep"


# -- 8. files -----------------------------------------------------------------------------------------
def test_symlinked_lock_is_refused_and_its_target_kept(tmp_path):
    run = paused_run(tmp_path)
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    lock = tmp_path / run / "lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(victim)
    with pytest.raises(RunError, match="symbolic link"):
        resume(run, tmp_path, quiet=True)
    assert victim.read_text() == "keep me"
    out = cli("resume", run, "--runs-dir", str(tmp_path))
    assert out.exit_code == 2 and "symbolic link" in out.stderr
    assert victim.read_text() == "keep me"


def test_status_never_writes_and_works_on_read_only_media(tmp_path):
    src = tmp_path / "src"
    run = paused_run(src)
    db = src / run / "mart.sqlite"
    before = db.read_bytes()
    out = cli("status", run, "--runs-dir", str(src))
    assert out.exit_code == 0 and "pending review" in out.stdout
    assert db.read_bytes() == before
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(src), str(ro)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("cannot bind-mount here (not root) for the read-only part")
    try:
        assert subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True).returncode == 0
        with pytest.raises(OSError):
            (ro / "probe").write_text("x")
        out = cli("status", run, "--runs-dir", str(ro))
        assert out.exit_code == 0, out.stderr
        assert "pending review" in out.stdout
        assert cli("status", "--runs-dir", str(ro)).exit_code == 0
        out = cli("resume", run, "--runs-dir", str(ro))  # writing is refused with one line
        assert out.exit_code != 0 and "Traceback" not in out.stderr and out.stderr.startswith("error:")
    finally:
        import gc

        gc.collect()  # connections the in-process CLI left open would keep the mount busy
        if subprocess.run(["umount", str(ro)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(ro)], capture_output=True)


def test_a_failed_start_leaves_no_run_folder(tmp_path):
    with pytest.raises(ValueError, match="cannot import"):
        tune(TuneOptions(backend="no_such_mod_" + uuid.uuid4().hex[:6] + ":f", runs_dir=str(tmp_path), quiet=True,
                         approve="auto"))
    assert list(tmp_path.iterdir()) == []


def test_bad_paths_and_options_end_in_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for args in (("tune", "--backend", TOY, "--runs-dir", str(afile), "--approve", "auto", "-q"),
                 ("status", "--runs-dir", str(afile)), ("resume", "nope", "--runs-dir", str(afile))):
        out = cli(*args)
        assert out.exit_code == 2 and out.stderr.startswith("error:") and out.stderr.count("\n") == 1, out.stderr
    run = paused_run(tmp_path / "runs")
    set_stored_options(tmp_path / "runs", run, '{"backend": 5')
    out = cli("resume", run, "--runs-dir", str(tmp_path / "runs"))
    assert out.exit_code == 2 and "stored options" in out.stderr and "Traceback" not in out.stderr
    set_stored_options(tmp_path / "runs", run, {"system_trials": -1})
    out = cli("resume", run, "--runs-dir", str(tmp_path / "runs"))
    assert out.exit_code == 2 and "stored options are invalid" in out.stderr


# -- 9. plugins never shadow installed modules ------------------------------------------------------
def test_current_directory_never_shadows_installed_modules(tmp_path):
    (tmp_path / "colorsys.py").write_text("raise SystemExit('shadowed!')\n")
    (tmp_path / "myplug.py").write_text(
        "import colorsys\nfrom tests.support.toy_backend import make_backend\n"
        "def make(**kw):\n    print('colorsys from', colorsys.__file__)\n    return make_backend(**kw)\n")
    code = ("import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
            f"sys.path.append({str(REPO)!r})\n"
            "from mart.trial_runner.registry import load_backend\n"
            "load_backend('myplug:make')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONSAFEPATH": "1"})
    assert out.returncode == 0, out.stderr
    assert "colorsys from" in out.stdout and str(tmp_path) not in out.stdout.split("colorsys from")[1]
    assert Path(out.stdout.split("colorsys from")[1].strip()).name == "colorsys.py"


# -- 6. --json shows what the agents used -----------------------------------------------------------
def test_json_summary_includes_agent_usage(tmp_path):
    out = cli("tune", "--backend", TOY, "--approve", "auto", "--runs-dir", str(tmp_path), "--json", "-q",
              "--system-trials", "2", "--learning-trials", "0", "--system-horizon", "2")
    assert out.exit_code == 0, out.stderr
    agents = json.loads(out.stdout)["agents"]
    assert {"calls", "prompt_tokens", "completion_tokens", "fallbacks", "repairs"} <= set(agents)


def test_a_run_killed_before_its_first_checkpoint_resumes(tmp_path):
    # what a kill -9 right after the run was created leaves: the run, its options, no checkpoint
    opts = TuneOptions(backend=TOY, approve="auto", runs_dir=str(tmp_path), system_trials=2, learning_trials=0,
                       system_horizon=2, watch_interval_s=0.01, quiet=True)
    store = RunStore.create(tmp_path, "r1", options=opts.model_dump(mode="json"))
    store.close()
    assert [p.name for p in tmp_path.iterdir()] == ["r1"]  # built under a hidden name, then renamed
    assert resume("r1", tmp_path, quiet=True)["status"] == "completed"
