"""Issue 26 items 4, 5, 11 and 12: a damaged, rolled-back or busy ledger is never written into blindly.

4. A damaged page (``PRAGMA integrity_check`` fails) was written into: ``mart review --approve`` exited 0 and
   launched a trial. Opening a run for writing checks integrity and refuses, saying the file is damaged and
   what can still be read.
5. Corrupt stored state gave raw tracebacks: one ``error:`` line naming the file and the cause instead.
11. A deleted or truncated ``mart.sqlite-wal`` silently rolled the run back and re-ran finished trials over
   their files: trial folders newer than the ledger are detected and the run is refused.
12. ``mart resume`` hid the real error behind "database is locked" and left the run marked ``running``.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from mart.state.run_store import RunError, RunStore
from tests.graph.test_hardening import cli, paused_run

pytestmark = pytest.mark.timeout(180)


def checkpoint_wal(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def damage_an_index(db: Path) -> None:
    """Overwrite bytes of an index's root page (the tables stay readable; integrity_check reports it). The
    pending writes' index: metrics, a WITHOUT ROWID table, has no index of its own."""
    checkpoint_wal(db)
    conn = sqlite3.connect(db)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE type='index' AND tbl_name='writes'").fetchone()[0]
    conn.close()
    original = db.read_bytes()
    for offset in range(page_size - 40, page_size // 2, -16):  # into the cells, not the page header
        data = bytearray(original)
        data[(root - 1) * page_size + offset:(root - 1) * page_size + offset + 16] = b"\x7f" * 16
        db.write_bytes(bytes(data))
        try:
            if sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] != "ok":
                return
        except sqlite3.DatabaseError:
            continue
    raise AssertionError("could not damage the index page")


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != "lock"}


def test_a_damaged_ledger_is_refused_for_writing_and_still_read(tmp_path):
    run = paused_run(tmp_path, system_trials=3)
    run_dir = tmp_path / run
    damage_an_index(run_dir / "mart.sqlite")
    before = snapshot(run_dir)
    for args in (("review", run, "--approve"), ("resume", run)):
        out = cli(*args, "--runs-dir", str(tmp_path))
        assert out.exit_code == 2, (args, out.stdout, out.stderr)
        assert "damaged" in out.stderr and "mart export" in out.stderr and "Traceback" not in out.stderr
        assert "fix the cause and" not in out.stderr
    assert snapshot(run_dir) == before  # nothing written, no trial launched
    out = cli("trials", run, "--runs-dir", str(tmp_path))
    assert out.exit_code == 0 and "sys-01-baseline" in out.stdout  # what can still be read, is
    with pytest.raises(RunError, match="damaged"):
        RunStore.open(run, tmp_path)
    RunStore.open(run, tmp_path, readonly=True).close()


def test_corrupt_stored_state_ends_in_one_line(tmp_path):
    run = paused_run(tmp_path)
    run_dir = tmp_path / run
    db = run_dir / "mart.sqlite"
    checkpoint_wal(db)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE runs SET options = '{\"backend\": '")  # not JSON
    conn.commit()
    conn.close()
    for args in (("status", run), ("review", run, "--approve"), ("export", run)):
        out = cli(*args, "--runs-dir", str(tmp_path))
        assert out.exit_code != 0 and out.stderr.startswith("error:"), (args, out.stderr, out.exception)
        assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    # poisoned checkpoints: the graph state cannot be read back
    conn = sqlite3.connect(db)
    conn.execute("UPDATE runs SET options = ?", (json.dumps({"backend": "tests.support.toy_backend:make_backend",
                                                             "approve": "none", "quiet": True}),))
    conn.execute("UPDATE checkpoints SET checkpoint = X'00ff00ff', type = 'msgpack'")
    conn.commit()
    conn.close()
    # mart status of a stopped run reads the ledger only (the review recorded at the stop): it still answers
    out = cli("status", run, "--runs-dir", str(tmp_path))
    assert out.exit_code == 0 and "pending review" in out.stdout and not out.stderr, (out.stderr, out.exception)
    for args in (("review", run, "--approve"), ("resume", run)):  # these read the graph's state: one line
        out = cli(*args, "--runs-dir", str(tmp_path))
        assert out.exit_code != 0 and out.stderr.startswith("error:"), (args, out.stderr, out.exception)
        assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
        assert "mart.sqlite" in out.stderr or run in out.stderr
    # a file that is not SQLite at all
    (run_dir / "mart.sqlite").write_bytes(b"garbage" * 1000)
    for name in ("mart.sqlite-wal", "mart.sqlite-shm"):
        (run_dir / name).unlink(missing_ok=True)
    for args in (("status", run), ("trials", run), ("export", run), ("report", run), ("resume", run)):
        out = cli(*args, "--runs-dir", str(tmp_path))
        assert out.exit_code != 0 and out.stderr.startswith("error:"), (args, out.stderr, out.exception)
        assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_plugin_spec_that_is_not_a_factory_ends_in_one_line(tmp_path):
    for spec in ("os:system", "json:loads"):
        out = cli("tune", "--backend", spec, "--runs-dir", str(tmp_path), "--approve", "auto", "-q")
        assert out.exit_code == 2 and out.stderr.startswith("error:") and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_report_that_cannot_be_written_ends_in_one_line(tmp_path):
    run = paused_run(tmp_path)
    (tmp_path / run / "report.html").mkdir()  # in the way: the page cannot replace a folder
    out = cli("report", run, "--runs-dir", str(tmp_path))
    assert out.exit_code == 1 and out.stderr.startswith("error: cannot write the report:"), out.stderr
    assert "report.html" in out.stderr and out.stderr.count("\n") == 1
    assert not [p for p in (tmp_path / run).iterdir() if p.name.endswith(".tmp")]  # nothing half-written left


def test_a_lost_wal_is_detected_and_finished_trials_are_never_overwritten(tmp_path):
    run = paused_run(tmp_path, system_trials=3)
    run_dir = tmp_path / run
    db = run_dir / "mart.sqlite"
    checkpoint_wal(db)
    old = db.read_bytes()  # the ledger as it was at review #1
    out = cli("review", run, "--runs-dir", str(tmp_path), "--approve", "-q")
    assert out.exit_code == 0, out.stderr
    finished = [p for p in (run_dir / "trials").iterdir() if p.name.startswith("sys-02")]
    assert len(finished) == 1 and (finished[0] / "status.json").is_file()
    files = snapshot(finished[0])
    # a kill, then the -wal file lost: the database rolls back to review #1, the trial folder stays
    db.write_bytes(old)
    for name in ("mart.sqlite-wal", "mart.sqlite-shm"):
        (run_dir / name).unlink(missing_ok=True)
    for args in (("review", run, "--approve"), ("resume", run)):
        out = cli(*args, "--runs-dir", str(tmp_path))
        assert out.exit_code == 2, (args, out.stdout, out.stderr)
        assert finished[0].name in out.stderr and "-wal" in out.stderr and "Traceback" not in out.stderr
    assert snapshot(finished[0]) == files  # never run again over its files
    out = cli("status", run, "--runs-dir", str(tmp_path))
    assert out.exit_code == 0 and finished[0].name in out.stdout  # the look says so too
