"""The review request is read by people in every channel: its numbers are rounded, its overrides exact."""

from __future__ import annotations

import json

from mart.graph.session import tune
from mart.state.options import TuneOptions
from mart.state.run_store import RunStore


def _floats(value):
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _floats(v)
    elif isinstance(value, list):
        for v in value:
            yield from _floats(v)


def test_review_payload_rounds_what_people_read_and_keeps_the_overrides_exact(tmp_path):
    out = tune(TuneOptions(backend="sim", backend_options={"clock": "poll"}, approve="none", runs_dir=str(tmp_path),
                           system_trials=3, learning_trials=0, system_horizon=4, watch_interval_s=0.01, quiet=True))
    request = out["pending_review"]
    [cand] = request["candidates"]
    shown = [cand["diff"], cand["critique"], cand["predicted_memory_gb"], request["memory_limit_gb"]]
    floats = list(_floats(shown))
    assert floats, "the sim's review shows predicted memory and a limit"
    for x in floats:
        assert len(f"{x:.12g}".lstrip("-").replace(".", "").lstrip("0").rstrip("0")) <= 6, x
    # the overrides are what will run: exactly the proposer's values recorded in the ledger
    store = RunStore.open(tmp_path / out["run_id"], tmp_path)
    try:
        [(stored,)] = store.ledger.db.execute("select overrides from proposals where candidate_id = ?",
                                              [cand["candidate_id"]]).fetchall()
    finally:
        store.close()
    assert cand["overrides"] == json.loads(stored)
    # the same request in LangChain's human-in-the-loop shape: one action request per candidate
    assert request["action_requests"] == [{"name": "run_trial", "args": {"candidate_id": cand["candidate_id"],
                                                                        "overrides": cand["overrides"]},
                                           "description": cand["rationale"]}]
    assert request["review_configs"][0]["allowed_decisions"] == ["approve", "edit", "reject", "respond"]
