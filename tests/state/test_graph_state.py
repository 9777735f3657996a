"""The running trial's handle lives in graph state as a ``TrialHandle`` (older checkpoints hold a dict)."""

from __future__ import annotations

import pytest

from mart.state.graph_state import active_handle
from mart.state.serde import make_serde
from mart.state.trials import TrialHandle

HANDLE = TrialHandle(trial_id="sys-02-abc", backend="local", trial_dir="/runs/r/trials/sys-02-abc", pid=4242,
                     pid_create_time=1_700_000_000.25, started_at=1_700_000_001.0, extra={"attempt": 2})


def test_active_handle_is_the_model_and_reads_a_legacy_dict() -> None:
    assert active_handle({"active": HANDLE}) is HANDLE
    assert active_handle({"active": HANDLE.model_dump(mode="json")}) == HANDLE  # checkpoint of an older version
    assert active_handle({"active": None}) is None and active_handle({}) is None


def test_handle_round_trips_through_the_strict_checkpoint_serializer() -> None:
    serde = make_serde()  # an explicit msgpack allow-list: any type not on it would come back as a dict
    back = serde.loads_typed(serde.dumps_typed({"active": HANDLE}))
    assert type(back["active"]) is TrialHandle and back["active"] == HANDLE


def test_a_broken_legacy_handle_is_refused() -> None:
    with pytest.raises(ValueError):
        active_handle({"active": {"pid": 1}})  # no trial id, backend or directory
