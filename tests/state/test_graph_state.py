"""The trials in flight live in graph state as ``RunningTrial`` models (record, handle, slot), and every state type
round-trips through the strict checkpoint serializer."""

from __future__ import annotations

from mart.state.graph_state import Batch, running_trials
from mart.state.models import Candidate, TrialRecord
from mart.state.serde import make_serde
from mart.state.trials import RunningTrial, TrialHandle

HANDLE = TrialHandle(trial_id="sys-02-abc", backend="local", trial_dir="/runs/r/trials/sys-02-abc", pid=4242,
                     pid_create_time=1_700_000_000.25, started_at=1_700_000_001.0, extra={"attempt": 2})
RECORD = TrialRecord(trial_id="sys-02-abc", stage="system", config={"a": 1})


def test_running_trials_reads_models_and_their_dict_form_in_launch_order() -> None:
    other = RunningTrial(record=TrialRecord(trial_id="lea-03-x", stage="learning"), slot=1)
    state = {"running": {"sys-02-abc": RunningTrial(record=RECORD, handle=HANDLE).model_dump(mode="json"),
                         "lea-03-x": other}}
    got = running_trials(state)
    assert [r.record.trial_id for r in got] == ["sys-02-abc", "lea-03-x"]
    assert got[0].handle == HANDLE and got[1].slot == 1
    assert [r.record.trial_id for r in running_trials(state, "learning")] == ["lea-03-x"]
    assert running_trials({}) == []


def test_state_types_round_trip_through_the_strict_checkpoint_serializer() -> None:
    serde = make_serde()  # an explicit msgpack allow-list: any type not on it would come back as a dict
    value = {"running": {"sys-02-abc": RunningTrial(record=RECORD, handle=HANDLE, slot=3)},
             "batch": Batch(want=2, candidates=[Candidate(candidate_id="c", stage="system", overrides={"a": 2})])}
    back = serde.loads_typed(serde.dumps_typed(value))
    assert type(back["running"]["sys-02-abc"]) is RunningTrial and back["running"]["sys-02-abc"] == value["running"]["sys-02-abc"]
    assert type(back["batch"]) is Batch and back["batch"] == value["batch"]


def test_checkpoint_blobs_are_compressed_and_an_older_runs_blobs_still_load() -> None:
    import zlib

    import pytest
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from mart.state.serde import MAX_INFLATED, allowed_types

    serde = make_serde()
    value = {"running": {f"sys-{i:02d}-abc": RunningTrial(record=RECORD, handle=HANDLE, slot=i) for i in range(5)}}
    plain = JsonPlusSerializer(allowed_msgpack_modules=allowed_types()).dumps_typed(value)  # an older run's blob
    kind, blob = serde.dumps_typed(value)
    assert kind == "msgpack+zlib" and len(blob) * 3 < len(plain[1])
    assert serde.loads_typed((kind, blob)) == value
    assert plain[0] == "msgpack" and serde.loads_typed(plain) == value
    # a crafted run folder's blob that inflates without end is refused, not read into memory
    bomb = zlib.compress(b"\0" * (MAX_INFLATED + 1))
    with pytest.raises(ValueError, match="inflates past"):
        serde.loads_typed(("msgpack+zlib", bomb))
