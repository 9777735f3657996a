"""Progress events from tool nodes: LangGraph's custom stream (CLI, Studio) plus an optional extra sink."""

from __future__ import annotations

from typing import Any


def emit(services, event: dict[str, Any]) -> None:
    try:
        from langgraph.config import get_stream_writer

        get_stream_writer()(event)
    except Exception:  # outside a streamed run there is no writer; progress is best-effort
        pass
    if services.progress is not None:
        services.progress(event)
