"""The checkpoint serializer, with mart's state types registered for strict msgpack mode.

Checkpoints and pending writes are stored zlib-compressed (type ``msgpack+zlib``): a checkpoint holds every
channel plus LangGraph's channel-version bookkeeping (49-character version strings per channel and per node,
half of an uncompressed checkpoint), which compresses ~5x. Blobs of an older run (``msgpack``) load unchanged.
"""

from __future__ import annotations

import zlib
from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from mart.state.graph_state import Batch
from mart.state.models import STATE_TYPES
from mart.state.trials import RunningTrial, TrialHandle, TrialPoll

ZLIB_TYPE = "msgpack+zlib"
# smaller blobs (most pending writes: a counter, a stage name) gain nothing from compression
_MIN_COMPRESS = 128
# a run folder is untrusted: a crafted blob may not inflate past this (a real checkpoint is a few KB)
MAX_INFLATED = 64 << 20


def allowed_types() -> list[tuple[str, str]]:
    types = [*STATE_TYPES, TrialHandle, TrialPoll, RunningTrial, Batch]
    return [(t.__module__, t.__qualname__) for t in types]


class CompressingSerializer(JsonPlusSerializer):
    """LangGraph's serializer with msgpack payloads deflated on write and inflated (bounded) on read."""

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        kind, data = super().dumps_typed(obj)
        if kind == "msgpack" and len(data) >= _MIN_COMPRESS:
            return ZLIB_TYPE, zlib.compress(data, 6)
        return kind, data

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        kind, blob = data
        if kind == ZLIB_TYPE:
            inflater = zlib.decompressobj()
            try:
                raw = inflater.decompress(blob, MAX_INFLATED)
            except zlib.error as e:
                raise ValueError(f"a checkpoint in the run's mart.sqlite is damaged (it does not inflate: {e})") from None
            if inflater.unconsumed_tail:
                raise ValueError(f"a checkpoint in the run's mart.sqlite inflates past {MAX_INFLATED >> 20} MB: refused")
            return super().loads_typed(("msgpack", raw))
        return super().loads_typed(data)


def make_serde() -> JsonPlusSerializer:
    """Serializer that round-trips mart's pydantic models (also under LANGGRAPH_STRICT_MSGPACK=true)."""
    return CompressingSerializer(allowed_msgpack_modules=allowed_types())
