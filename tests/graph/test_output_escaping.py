"""Issue 26 item 1c and issue 28: every foreign string is escaped on every output, not only in the review.

Window-title, hyperlink and DCS sequences, C1 controls (U+009B is a one-character CSI on many terminals) and
bidi overrides from trial logs, LLM text and the ledger's ``error`` reached the screen in progress lines,
``mart trials`` and ``mart status``; ``mart report --format md`` passed raw HTML (a verl error line
``<img onerror=...>`` ran in a browser after rendering). The oracles are independent of mart's code: the
characters a terminal acts on, and what markdown-it (CommonMark) renders the Markdown into.
"""

from __future__ import annotations

import io
import json
import sqlite3

import pytest

#: clear screen, window title (OSC 0), hyperlink (OSC 8), DCS, C1 CSI, bidi override, carriage return
EVIL = ("bad\x1b[2J\x1b]0;owned\x07 \x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\ \x1bPq#0;1\x1b\\ "
        "\x9b2J \x9d0;t\x9c \u202egnp.exe\u202c\rX")
HTML = '<img src=x onerror="alert(1)"> ![t](https://evil.example/track.png) [docs](javascript:alert(1)) </td>'
#: what a terminal acts on: C0 controls but tab and newline, DEL, C1 controls, bidi embeddings and overrides
TERMINAL = {chr(c) for c in [*range(0, 9), *range(11, 32), 127, *range(0x80, 0xA0)]} | set(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def controls(text: str) -> set[str]:
    return {c for c in text if c in TERMINAL}


def cli(*args: str):
    from typer.testing import CliRunner

    from mart.graph.cli import app

    return CliRunner().invoke(app, list(args))


@pytest.fixture
def hostile_run(tmp_path):
    """A finished toy run whose ledger strings (trial reason, overrides, health message, run error) are hostile."""
    from mart.graph.session import tune
    from mart.state.options import TuneOptions

    out = tune(TuneOptions(backend="tests.support.toy_backend:make_backend", approve="auto", runs_dir=str(tmp_path),
                           system_trials=2, learning_trials=0, system_horizon=2, watch_interval_s=0.01, quiet=True,
                           report=False))
    run = out["run_id"]
    db = sqlite3.connect(tmp_path / run / "mart.sqlite")
    db.execute("UPDATE trials SET reason = ?, status = 'failed', overrides = ?", (EVIL + HTML,
               json.dumps({"actor.optim.lr" + EVIL: EVIL + HTML})))
    db.execute("UPDATE runs SET error = ?, status = 'failed'", (EVIL + HTML,))
    db.execute("INSERT INTO health_events (event_id, trial_id, step, rule, severity, message) VALUES "
               "('e1', 'sys-01-baseline', 1, ?, 'stop', ?)", (EVIL, EVIL + HTML))
    db.commit()
    db.close()
    return tmp_path, run


def test_progress_lines_carry_no_terminal_controls():
    from rich.console import Console

    from mart.graph.progress_console import ConsoleProgress
    from mart.nodes.progress import parse_event

    progress = ConsoleProgress(quiet=False)
    progress.console = Console(file=io.StringIO(), width=400, color_system=None)
    for event in ({"event": "trial_failed", "trial_id": "t" + EVIL, "reason": EVIL},
                  {"event": "health", "trial_id": "t1", "severity": "stop", "rule": EVIL, "message": EVIL},
                  {"event": "trial_stopped", "trial_id": "t1", "reason": EVIL, "status": "failed"},
                  {"event": "critique", "pick": None, "feedback": EVIL},
                  {"event": "trial_launched", "trial_id": "t2", "stage": "system", "kind": "candidate", "horizon": 3,
                   "changes": [EVIL]},
                  {"event": "trial_done", "trial_id": "t1", "status": "failed", "eligible": False, "reason": EVIL}):
        progress(parse_event(event))
    text = progress.console.file.getvalue()
    assert controls(text) == set(), sorted(map(hex, map(ord, controls(text))))
    assert text.count("gnp.exe") >= 6 and "owned" in text  # the words stay, only the controls go


def test_trials_and_status_print_no_terminal_controls(hostile_run):
    tmp_path, run = hostile_run
    for args in (("trials", run), ("status", run), ("status",)):
        out = cli(*args, "--runs-dir", str(tmp_path))
        assert out.exit_code == 0, out.stderr
        assert controls(out.stdout) == set(), (args, sorted(map(hex, map(ord, controls(out.stdout)))))
    assert "gnp.exe" in cli("status", run, "--runs-dir", str(tmp_path)).stdout


def test_markdown_report_renders_no_html_and_no_remote_image(hostile_run, tmp_path):
    from markdown_it import MarkdownIt

    runs, run = hostile_run
    out = cli("report", run, "--runs-dir", str(runs), "--format", "md")
    assert out.exit_code == 0, out.stderr
    md = (runs / run / "report.md").read_text()
    assert controls(md) == set()
    rendered = MarkdownIt("commonmark").enable("table").render(md)
    assert "<img src=\"x\"" not in rendered and "onerror" not in rendered.replace("onerror=&quot;", "")
    assert "evil.example/track.png\"" not in rendered  # no image fetched from elsewhere
    assert 'href="javascript' not in rendered
    assert "&lt;img" in rendered  # the text is still there, as text
    # the HTML report: the same strings as text (no controls either)
    out = cli("report", run, "--runs-dir", str(runs))
    page = (runs / run / "report.html").read_text()
    assert controls(page) == set() and "<img src=x" not in page


def test_c1_controls_are_dropped_for_the_terminal_and_slack():
    """Issue 28: U+009B (CSI) and the other C1 controls never reach a reviewer's terminal or Slack."""
    from mart.graph.reviewers.base import format_request
    from mart.graph.reviewers.slack_blocks import review_blocks

    cand = {"candidate_id": "c1\x9b2J", "source": "llm", "diff": [{"key": "k", "current": 1, "proposed": "\x9b31m"}],
            "rationale": "why\x9b2J\x85\x9d0;t\x9c", "critique": {"risk": "low", "reasons": ["\x90q\x9c"]},
            "overrides": {"k": 2}}
    request = {"run_id": "r1", "review_no": 1, "stage": "system", "interrupt_id": "i1", "candidates": [cand],
               "error": "refused\x9b2J"}
    def shown_text(node) -> list[str]:  # what Slack shows: every "text" of the blocks
        if isinstance(node, dict):
            return [t for k, v in node.items() for t in ([v] if k == "text" and isinstance(v, str) else shown_text(v))]
        return [t for v in node for t in shown_text(v)] if isinstance(node, list) else []

    text = format_request(request)
    blob = "\n".join(shown_text(review_blocks(request)))
    assert "why2J" in blob
    for shown in (text, blob):
        assert not {c for c in shown if 0x80 <= ord(c) < 0xA0}, shown
    assert "why2J" in text


# -- issue 26 item 3, issue 28: the exported schedule script runs exactly the launches, nothing else ----------
def _completed_schedule_run(tmp_path, run_id: str, segments: list, fixed: dict) -> str:
    from mart.state.run_store import RunStore

    store = RunStore.create(tmp_path, "r1", options={"start_overrides": fixed})
    summary = {"run_id": run_id, "status": "completed", "system": {"best_config": {}}, "learning": {},
               "schedule": {"segments": segments, "final_score": 0.5, "static_best_score": 0.4, "gain": 0.1}}
    store.ledger.upsert_run("r1", status="completed", summary=summary)
    store.close()
    return "r1"


def _run_script(tmp_path, text: str) -> list[list[str]]:
    import subprocess
    import sys

    script = tmp_path / "schedule.sh"
    script.write_text(text)
    rec = tmp_path / "rec.py"
    log = tmp_path / "launches.jsonl"
    rec.write_text(f"import json, sys\nopen({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    out = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "VERL_CMD": f"{sys.executable} {rec}"})
    assert out.returncode == 0, out.stderr
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def test_schedule_script_quotes_every_stored_field(tmp_path):
    marker = tmp_path / "pwned"
    evil = f"$(touch {marker}); `touch {marker}` ' \" \\ \n touch {marker}"
    segments = [{"from_step": 0, "to_step": 2, "overrides": {"actor.optim.lr": evil}, "changes": {}},
                {"from_step": 2, "to_step": 4, "overrides": {"actor.optim.lr": 1e-6, "x.y": "a b"}, "changes": {}}]
    run = _completed_schedule_run(tmp_path / "runs", f"r1\ntouch {marker}\n#", segments, {"k.z": "it's"})
    out = cli("export", run, "--runs-dir", str(tmp_path / "runs"), "--schedule", "--format", "sh",
              "--checkpoint-dir", f"ck dir/$(touch {marker})")
    assert out.exit_code == 0, out.stderr
    launches = _run_script(tmp_path, out.stdout)
    assert not marker.exists()
    assert len(launches) == 2
    lr = [a for a in launches[0] if a.lstrip("+").startswith("actor.optim.lr=")]
    assert len(lr) == 1 and "touch" in lr[0] and "\n" in lr[0]  # the value arrived whole, as one argument
    assert {"x.y=a b", "x.y='a b'", "+x.y='a b'", "+x.y=a b"} & set(launches[1])
    assert any(a.startswith("trainer.default_local_dir=ck dir/$(touch") for a in launches[0])


def test_schedule_script_refuses_step_bounds_that_are_not_numbers(tmp_path):
    marker = tmp_path / "pwned"
    segments = [{"from_step": 0, "to_step": f"2\ntouch {marker}", "overrides": {}, "changes": {}}]
    run = _completed_schedule_run(tmp_path / "runs", "r1", segments, {})
    out = cli("export", run, "--runs-dir", str(tmp_path / "runs"), "--schedule", "--format", "sh")
    assert out.exit_code == 2 and "to_step" in out.stderr and out.stdout == ""
    assert not marker.exists()
