"""The checkpoint serializer, with mart's state types registered for strict msgpack mode."""

from __future__ import annotations

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from mart.state.graph_state import Batch
from mart.state.models import STATE_TYPES
from mart.state.trials import RunningTrial, TrialHandle, TrialPoll


def allowed_types() -> list[tuple[str, str]]:
    types = [*STATE_TYPES, TrialHandle, TrialPoll, RunningTrial, Batch]
    return [(t.__module__, t.__qualname__) for t in types]


def make_serde() -> JsonPlusSerializer:
    """Serializer that round-trips mart's pydantic models (also under LANGGRAPH_STRICT_MSGPACK=true)."""
    return JsonPlusSerializer(allowed_msgpack_modules=allowed_types())
