"""Reading verl-format metric streams robustly: complete lines only, null -> NaN, tolerant of junk."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable

from mart.state.metrics import StepRecord, parse_line


class MetricsTail:
    """Incremental reader of a growing JSONL file: returns only ``\\n``-terminated lines, once each.

    Keeps a byte offset, so a half-written last line is read on a later call, when it is complete.
    ``parse`` turns one line into a record (default: verl's file-logger JSON; console logs use another).
    """

    def __init__(self, path: str | os.PathLike, offset: int = 0,
                 parse: Callable[[str], StepRecord | None] | None = None) -> None:
        self.path = Path(path)
        self.offset = offset
        self.parse = parse or parse_line

    def read_new(self, final: bool = False) -> list[StepRecord]:
        """Records of the new complete lines; with ``final`` (the writer has exited) also of a last line
        without newline."""
        return [rec for line in self.read_lines(final) if (rec := self.parse(line)) is not None]

    def read_lines(self, final: bool = False) -> list[str]:
        """The new complete lines (decoded), once each; with ``final`` also a last line without newline."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        size = len(chunk)
        if final and chunk and not chunk.endswith(b"\n"):
            chunk += b"\n"  # nothing will complete it now; a half-written JSON line still fails to parse
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += min(end + 1, size)
        return [raw.decode("utf-8", errors="replace") for raw in chunk[: end + 1].splitlines()]


def write_record(f, step: int, data: dict[str, Any]) -> None:
    """Append one verl-format line (NaN/inf -> null) and flush it whole."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()}
    f.write(json.dumps({"step": step, "data": clean}) + "\n")
    f.flush()
