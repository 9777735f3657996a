"""Ledger writes are idempotent: a node re-run after a crash repeats its writes and nothing is duplicated or lost."""

from __future__ import annotations

import math

import pytest

from mart.state.ledger import Ledger
from mart.state.metrics import StepRecord
from mart.state.models import Candidate, Critique, HealthEvent, ReviewDecision, TrialRecord, TrialStatus


def _ledger(tmp_path) -> Ledger:
    return Ledger(tmp_path / "mart.sqlite")


def test_health_events_have_deterministic_ids(tmp_path):
    ledger = _ledger(tmp_path)
    warn = HealthEvent(trial_id="t1", step=4, rule="entropy_collapse", severity="warn", message="1/3", value=0.01)
    kl = HealthEvent(trial_id="t1", step=4, rule="kl_blowup", severity="warn", message="x", value=2.0)
    ledger.add_health_events([warn, kl])
    ledger.add_health_events([warn, kl])  # the health monitor re-run on the same stream
    assert len(ledger.table_rows("health_events")) == 2
    # a later step is a new event; the same step re-evaluated replaces (warn -> stop at the same step)
    ledger.add_health_events([warn.model_copy(update={"step": 6, "severity": "stop", "message": "3/3"})])
    ledger.add_health_events([kl.model_copy(update={"severity": "stop"})])
    rows = {(r["rule"], r["step"]): r for r in ledger.table_rows("health_events")}
    assert set(rows) == {("entropy_collapse", 4), ("entropy_collapse", 6), ("kl_blowup", 4)}
    assert rows[("kl_blowup", 4)]["severity"] == "stop"
    assert [e.step for e in ledger.health_events("t1") if e.rule == "entropy_collapse"] == [4, 6]


def _ledger_with_rowid_metrics(tmp_path) -> Ledger:
    """A ledger as mart made it before metrics became a WITHOUT ROWID table (a rowid table plus its index)."""
    import sqlite3

    conn = sqlite3.connect(tmp_path / "mart.sqlite")
    conn.execute("CREATE TABLE [metrics] ([trial_id] TEXT, [step] INTEGER, [key] TEXT, [value] FLOAT, "
                 "PRIMARY KEY ([trial_id], [step], [key]))")
    conn.execute("INSERT INTO metrics VALUES ('old', 1, 'perf/throughput', 5.0)")
    conn.commit()
    conn.close()
    return _ledger(tmp_path)


@pytest.mark.parametrize("layout", ["new", "before"])
def test_metrics_rewritten_not_duplicated(tmp_path, layout):
    ledger = _ledger(tmp_path) if layout == "new" else _ledger_with_rowid_metrics(tmp_path)
    if layout == "before":  # the rows an older mart wrote still read, and the table takes new ones the same way
        assert ledger.metric_records("old")[0].data == {"perf/throughput": 5.0}
        ledger.db.execute("DELETE FROM metrics WHERE trial_id = 'old'")
    recs = [StepRecord(s, {"perf/throughput": 10.0 * s, "actor/entropy": 1.0}) for s in range(0, 4)]
    ledger.add_metrics("t1", recs)
    ledger.add_metrics("t1", recs[2:])  # watch re-reads the tail after a resume
    ledger.add_metrics("t1", [StepRecord(3, {"actor/entropy": math.nan})])
    assert len(ledger.table_rows("metrics")) == 8
    back = ledger.metric_records("t1")
    assert [r.step for r in back] == [0, 1, 2, 3]
    assert back[3].data["perf/throughput"] == 30.0 and math.isnan(back[3].data["actor/entropy"])
    assert ledger.metric_records("other") == []


def test_metrics_need_no_index_beside_their_table(tmp_path):
    """A new ledger keeps metric rows in their primary key's b-tree: no second copy of every key in an index
    (that index was a third of a default session's file)."""
    ledger = _ledger(tmp_path)
    ledger.add_metrics("t1", [StepRecord(s, {f"k{i}": float(i) for i in range(40)}) for s in range(50)])
    indexes = ledger.db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'metrics'").fetchall()
    assert indexes == []
    plan = " ".join(str(r) for r in ledger.db.execute(
        "EXPLAIN QUERY PLAN SELECT * FROM metrics WHERE trial_id = 't1' ORDER BY step").fetchall())
    assert "PRIMARY KEY" in plan  # lookups by trial still use the key, not a scan
    assert len(ledger.metric_records("t1")) == 50


def test_proposals_critiques_reviews_upsert(tmp_path):
    ledger = _ledger(tmp_path)
    cands = [Candidate(candidate_id=f"c{i}", stage="system", overrides={"k": i}, expected_gain=0.1 * i)
             for i in range(3)]
    crits = [Critique(candidate_id=c.candidate_id, accepted=True, reasons=["ok"], score=0.5) for c in cands]
    decision = ReviewDecision(action="approve", reviewer="ann", channel="cli")
    for _ in range(2):  # the proposer, critic and review nodes re-run after a crash
        ledger.add_proposals("run", 0, cands)
        ledger.add_critiques("run", crits, ["c1"])
        ledger.add_review("run", "review-001", "c1", decision)
    assert sorted(r["candidate_id"] for r in ledger.table_rows("proposals")) == ["c0", "c1", "c2"]
    assert [r["picked"] for r in sorted(ledger.table_rows("critiques"), key=lambda r: r["candidate_id"])] == [0, 1, 0]
    assert len(ledger.table_rows("reviews")) == 1
    # a batch: several picks
    ledger.add_critiques("run", crits, ["c0", "c2"])
    assert [r["picked"] for r in sorted(ledger.table_rows("critiques"), key=lambda r: r["candidate_id"])] == [1, 0, 1]


def test_trial_upserts_keep_launch_fields(tmp_path):
    ledger = _ledger(tmp_path)
    rec = TrialRecord(trial_id="t1", stage="system", kind="candidate", candidate_id="c1", config={"k": 1})
    ledger.upsert_trial(rec, run_id="run", seq=3, horizon=5, trial_dir="/runs/r/t1", started_at=100.0,
                        overrides={"k": 1})
    handle = {"trial_id": "t1", "backend": "toy", "pid": 4242, "trial_dir": "/runs/r/t1"}
    ledger.set_trial_fields("t1", handle=handle)
    done = rec.model_copy(update={"status": TrialStatus.COMPLETED, "steps_done": 5, "throughput": 12.5})
    for ended in (200.0, 201.0):  # collect re-run after a crash: the second write wins, nothing else moves
        ledger.upsert_trial(done, run_id="run", ended_at=ended)
    [row] = ledger.trials()
    assert row["handle"] == handle
    assert row["seq"] == 3 and row["horizon"] == 5
    assert row["trial_dir"] == "/runs/r/t1" and row["started_at"] == 100.0
    assert row["overrides"] == {"k": 1}
    assert row["status"] == "completed" and row["throughput"] == 12.5 and row["ended_at"] == 201.0
    assert len(ledger.table_rows("trials")) == 1


def test_trial_rows_are_typed_and_a_column_of_the_wrong_type_is_named(tmp_path):
    import pytest
    from pydantic import ValidationError

    from mart.state.ledger import TrialRow

    ledger = _ledger(tmp_path)
    rec = TrialRecord(trial_id="t1", stage="system", config={"a": 1}, status=TrialStatus.COMPLETED, throughput=12.5,
                      early_stopped=True)
    ledger.upsert_trial(rec, run_id="r", seq=1, handle={"pid": 7})
    [row] = ledger.trial_rows()
    assert isinstance(row, TrialRow)
    assert (row.config, row.handle, row.throughput, row.early_stopped, row.seq) == ({"a": 1}, {"pid": 7}, 12.5, True, 1)
    assert ledger.trials() == [row.model_dump()]  # the dict readers are the same rows
    # a column a newer mart added is kept, not refused
    ledger.db.execute("alter table trials add column future_col text")
    ledger.db.execute("update trials set future_col = 'x'")
    assert ledger.trial("t1")["future_col"] == "x"
    # a damaged value fails on read, naming its column
    ledger.db.execute("update trials set throughput = 'fast'")
    with pytest.raises(ValidationError, match="throughput"):
        ledger.trials()
