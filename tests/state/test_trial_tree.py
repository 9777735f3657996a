"""The ledger records the trial tree: each trial's parent checkpoint and step (null for a root trial);
a ledger written before these columns existed gains them on open."""

from __future__ import annotations

import sqlite3

from mart.state.ledger import Ledger
from mart.state.models import TrialRecord, TrialStatus


def test_ledger_records_parent_checkpoint_and_step(tmp_path):
    ledger = Ledger(tmp_path / "mart.sqlite")
    ledger.upsert_trial(TrialRecord(trial_id="root", stage="learning", status=TrialStatus.COMPLETED), run_id="r", seq=1)
    child = TrialRecord(trial_id="child", stage="learning", parent_trial="root",
                        parent_checkpoint="runs/r/trials/root/checkpoints/global_step_10", parent_step=10)
    ledger.upsert_trial(child, run_id="r", seq=2)
    assert ledger.trial("root")["parent_step"] is None and ledger.trial("root")["parent_trial"] is None
    row = ledger.trial("child")
    assert (row["parent_trial"], row["parent_step"]) == ("root", 10)
    assert row["parent_checkpoint"].endswith("global_step_10")
    ledger.close()


def test_an_older_ledger_gains_the_tree_columns(tmp_path):
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("create table trials (trial_id text primary key, run_id text, seq int, stage text)")
    conn.commit()
    conn.close()
    ledger = Ledger(path)
    assert {"parent_trial", "parent_checkpoint", "parent_step"} <= set(ledger.db["trials"].columns_dict)
    ledger.close()
