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


# -- 3. a checkpoint blob's decoded size is bounded --------------------------------------------------------------
def _empty_arrays(n: int) -> bytes:
    """msgpack of one array of ``n`` empty arrays, deflated: 19 KB for 20 million (~20 MB inflated)."""
    import zlib

    return zlib.compress(b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n, 9)


_LOAD_IN_A_CHILD = """
import sys, time, zlib
from mart.state.serde import make_serde
blob = open(sys.argv[1], "rb").read()
serde = make_serde()
start, cpu = time.monotonic(), time.process_time()
try:
    serde.loads_typed(("msgpack+zlib", blob))
    print("decoded")
except ValueError as e:
    print("refused:", e)
# the peak RSS of this process's own memory: VmHWM starts afresh at exec, while getrusage's ru_maxrss keeps the
# peak of the forking parent (pytest) from before the exec
hwm_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(time.monotonic() - start, time.process_time() - cpu, hwm_kb // 1024)
"""


def test_an_inflation_bomb_checkpoint_is_refused_fast_and_small(tmp_path):
    import sys

    for n in (20_000_000, 4_000_000):  # over the inflated-bytes cap; under it, but over the objects cap
        blob = tmp_path / f"bomb-{n}"
        blob.write_bytes(_empty_arrays(n))
        assert blob.stat().st_size < 25_000
        child = subprocess.run([sys.executable, "-c", _LOAD_IN_A_CHILD, str(blob)], capture_output=True, text=True,
                               timeout=120)
        verdict, figures = child.stdout.strip().splitlines()
        wall_s, cpu_s, rss_mb = float(figures.split()[0]), float(figures.split()[1]), int(figures.split()[2])
        assert verdict.startswith("refused: a checkpoint in the run's mart.sqlite"), child.stdout + child.stderr
        # CPU seconds: the work of the refusal, whatever else the machine runs (its wall time was 0.2 s unloaded)
        assert cpu_s < 2.0 and rss_mb < 200, (n, wall_s, cpu_s, rss_mb)


def test_mart_review_of_a_run_with_a_bomb_checkpoint_ends_in_one_error_line(tmp_path):
    runs = tmp_path / "runs"
    run_id = _paused_toy(runs)
    with sqlite3.connect(runs / run_id / "mart.sqlite") as db:
        db.execute("UPDATE checkpoints SET type = 'msgpack+zlib', checkpoint = ? WHERE rowid = (SELECT max(rowid) "
                   "FROM checkpoints)", (_empty_arrays(20_000_000),))
    out = cli("review", run_id, "--runs-dir", str(runs), "--approve")
    assert out.exit_code != 0
    errors = [line for line in out.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "refused" in errors[0] and "Traceback" not in out.output, out.output


def _paused_toy(runs: Path) -> str:
    from tests.support.cli import paused_toy_run

    return paused_toy_run(str(runs))["run_id"]


# -- 4. the lower items ----------------------------------------------------------------------------------------
EVIL = "\x1b]0;pwned\x07 \x1b]8;;https://evil.example\x07click\x1b]8;;\x07 \x1bP+q\x1b\\ \u202etxt.exe\u202c \x9b2J"


class _CrashingBackend:
    """Every trial crashes with a reason taken from its log, full of terminal escapes."""

    @staticmethod
    def make(**options):
        from tests.support.toy_backend import ToyBackend

        class Crashing(ToyBackend):
            def make_runner(self):
                runner = super().make_runner()
                real = runner.launch

                def launch(spec):
                    handle = real(spec)
                    from mart.trial_runner.base import write_status

                    write_status(spec.trial_dir, "failed", f"Traceback ... RuntimeError: {EVIL}", 0)
                    return handle

                runner.launch = launch
                return runner

        return Crashing(**options)


make_crashing = _CrashingBackend.make


def test_the_session_failed_line_prints_no_terminal_escapes_from_a_trial(tmp_path):
    out = cli("tune", "--backend", "tests.graph.test_hardening_round3:make_crashing", "--approve", "auto",
              "--runs-dir", str(tmp_path), "-q", "--system-trials", "2", "--learning-trials", "0",
              "--system-horizon", "2", "--watch-interval-s", "0.01", "--no-report")
    assert out.exit_code == 1, out.output
    [line] = [x for x in out.output.splitlines() if x.startswith("error: the session failed")]
    assert "RuntimeError" in line and "click" in line  # the reason is still said
    assert not any(c in line for c in "\x1b\x07\x9b\u202e\u202c"), repr(line)


def test_a_signed_click_for_a_candidate_not_in_the_batch_is_answered_cleanly(tmp_path, caplog):
    import logging

    from mart.graph.reviewers.slack import slack_client
    from mart.graph.reviewers.slack_blocks import ACTION_APPROVE, review_blocks
    from mart.graph.session import pending_review
    from mart.graph.slack_service import SlackReviewService
    from mart.state.ledger import Ledger
    from mart.state.run_store import RunStore
    from tests.graph.test_slack_batch import ALICE, TOKEN, _click, _dispatch
    from tests.support.slack_stub import SlackStub

    run = _paused_toy(tmp_path)
    store = RunStore.open(run, tmp_path)
    request = pending_review(store)
    store.close()
    row = next(b for b in review_blocks(request) if b["type"] == "actions")
    click = _click(row, ACTION_APPROVE)
    value = json.loads(click["actions"][0]["value"])
    click["actions"][0]["value"] = json.dumps({**value, "candidate": "sys-99-forged"})
    before = len(Ledger.open(tmp_path / run).trials())
    caplog.set_level(logging.INFO, logger="mart")
    with SlackStub(TOKEN) as stub:
        from tests.graph.test_slack_batch import SECRET

        service = SlackReviewService(tmp_path, signing_secret=SECRET, reviewers={ALICE},
                                     client=slack_client(stub.api_url, TOKEN), token_verification=False)
        assert _dispatch(service, click) == 200
        [note] = stub.wait_for("chat.postEphemeral")
        assert service.wait_idle(timeout=30)
        posted = [c["params"].get("text", "") for c in stub.of("chat.postMessage")]
    assert "sys-99-forged" in note["params"]["text"] and "nothing changed" in note["params"]["text"]
    assert not any("failed" in t for t in posted), posted
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text
    assert len(Ledger.open(tmp_path / run).trials()) == before  # nothing ran


def test_the_notebook_graph_refuses_a_bare_resume_and_records_claims_as_claims(tmp_path):
    import getpass

    import pytest
    from langgraph.types import Command

    from mart.graph.api import BareResume, open_run
    from mart.state.ledger import Ledger

    run = _paused_toy(tmp_path)
    with open_run(run, tmp_path) as h:
        pending = h.pending_review()
        head = h.state().config["configurable"]["checkpoint_id"]
        for bare in ({"action": "approve"}, "approve", {"decisions": [{"type": "approve"}]}):
            with pytest.raises(BareResume, match="interrupt id"):
                h.graph.invoke(Command(resume=bare), h.config, context=h.context)
        with pytest.raises(Exception, match="Unknown or already-consumed interrupt"):  # another id: strict resume
            h.graph.invoke(Command(resume={"0" * 32: {"action": "approve"}}), h.config, context=h.context)
        assert h.state().config["configurable"]["checkpoint_id"] == head  # nothing ran, nothing was written
        assert h.pending_review()["interrupt_id"] == pending["interrupt_id"]
        h.graph.invoke(Command(resume={pending["interrupt_id"]: {"action": "approve", "reviewer": "U0BOSS",
                                                                  "channel": "slack"}}), h.config, context=h.context)
        [row] = [r for r in Ledger.open(h.store.run_dir).table_rows("reviews") if r["review_no"] == 1]
    assert row["channel"] == "api"  # not "slack": the API delivered it
    assert row["reviewer"] == f"U0BOSS (claimed; api user {getpass.getuser()})"


def test_status_with_another_runs_dir_never_shows_a_same_named_run_from_the_cwd(tmp_path, monkeypatch):
    import shutil

    here, other = tmp_path / "here", tmp_path / "other"
    run = _paused_toy(here)
    other.mkdir()
    shutil.copytree(here / run, tmp_path / run)  # a same-named run folder where the command runs
    monkeypatch.chdir(tmp_path)
    out = cli("status", run, "--runs-dir", str(other))
    assert out.exit_code != 0 and "no run" in out.output and str(other) in out.output, out.output
    assert cli("status", f"./{run}", "--runs-dir", str(other)).exit_code == 0  # named by its path: shown
    assert cli("status", run, "--runs-dir", str(here)).exit_code == 0


def test_a_ledger_with_two_runs_rows_is_named_as_such(tmp_path):
    run = _paused_toy(tmp_path)
    with sqlite3.connect(tmp_path / run / "mart.sqlite") as db:
        db.execute("INSERT INTO runs (run_id, status) VALUES ('other-run', 'paused')")
    for command in ("status", "review"):
        out = cli(command, run, "--runs-dir", str(tmp_path))
        assert out.exit_code != 0
        [line] = [x for x in out.output.splitlines() if x.startswith("error:")]
        assert "2 rows in its runs table" in line and "'other-run'" in line and "no ledger tables" not in line, line


def test_negative_marti_values_in_exponent_notation_survive_its_argv():
    from mart.trial_runner.marti.argv import build_argv, flag_args
    from mart.trial_runner.marti.prevalidate import check_argv, parse_argv

    args = flag_args("eps_clip_low_high", [-1e-05, 0.2])
    assert args == ["--eps_clip_low_high", "-0.00001", "0.2"]
    argv = build_argv({"eps_clip_low_high": [-1e-05, 0.2], "reward_clip_range": [-1e-07, 1e-07]})
    assert check_argv(argv) == [], check_argv(argv)
    ns = parse_argv(["--agents", "{}", *argv])
    assert list(ns.eps_clip_low_high) == [-1e-05, 0.2] and list(ns.reward_clip_range) == [-1e-07, 1e-07]


# -- a package missing from mart's environment is named as such, not blamed on the run folder ----------------------
def test_a_missing_package_is_named_as_the_environments_fault_not_a_damaged_run(capsys):
    import pytest
    import typer

    from mart.graph.cli.errors import one_line_errors

    @one_line_errors
    def command(run: str = "r1"):
        import mart_no_such_package  # noqa: F401

    with pytest.raises(typer.Exit) as ended:
        command(run="r1")
    err = capsys.readouterr().err
    assert ended.value.exit_code == 1
    assert "No module named 'mart_no_such_package'" in err and "lacks a package" in err
    assert "damaged" not in err and err.count("\n") == 1
