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
# A run folder is untrusted: a crafted blob is bounded before it is decoded, in bytes and in objects.
# A real checkpoint inflates to a few KB (8.6 KB and ~110 arrays and maps after 3 trials) and grows with the queue
# and the feedback, not with the run's length: a blob past MAX_INFLATED (~2000x that) is not one of mart's.
MAX_INFLATED = 16 << 20
# Bytes alone do not bound the decoded size: one byte (0x90) decodes into an empty list of 56+8 bytes, so 20 MB
# of them took 1.6 GB. Every msgpack value that allocates (array, map, str, bin, ext, float, int outside -32..127)
# starts with a byte outside 0x00-0x7f and 0xc0-0xc3; counting those bytes (a C-speed ``translate``, ~10 ms per
# MB) over-counts (text in strings may hold such bytes) but never under-counts, so at most MAX_OBJECTS objects are
# built (~40 MB). Depth is bounded by the decoder itself (ormsgpack refuses nesting past its recursion limit).
MAX_OBJECTS = 500_000
_CHEAP = bytes(range(0x80)) + bytes(range(0xC0, 0xC4))


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
                raise ValueError(f"a checkpoint in the run's mart.sqlite inflates past {MAX_INFLATED >> 20} MB "
                                 "(a real one is a few KB): refused")
            return self._decode(raw)
        if kind == "msgpack":
            if len(blob) > MAX_INFLATED:
                raise ValueError(f"a checkpoint in the run's mart.sqlite is over {MAX_INFLATED >> 20} MB "
                                 "(a real one is a few KB): refused")
            return self._decode(blob)
        return super().loads_typed(data)

    def _decode(self, raw: bytes) -> Any:
        objects = len(raw.translate(None, _CHEAP))
        if objects > MAX_OBJECTS:
            raise ValueError(f"a checkpoint in the run's mart.sqlite would decode into up to {objects} objects, over "
                             f"{MAX_OBJECTS} (a real one has a few hundred): refused")
        try:
            return super().loads_typed(("msgpack", raw))
        except RecursionError:
            raise ValueError("a checkpoint in the run's mart.sqlite nests too deep to decode: refused") from None


def make_serde() -> JsonPlusSerializer:
    """Serializer that round-trips mart's pydantic models (also under LANGGRAPH_STRICT_MSGPACK=true)."""
    return CompressingSerializer(allowed_msgpack_modules=allowed_types())
