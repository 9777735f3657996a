"""Reading review requests in tests: one review covers the candidates of the free trial slots."""

from __future__ import annotations

from typing import Any


def only(request: dict[str, Any]) -> dict[str, Any]:
    """The candidate of a one-candidate review (a one-slot session's reviews all are)."""
    cands = request["candidates"]
    assert len(cands) == 1, f"expected one candidate, the review has {len(cands)}"
    return cands[0]
