"""Reviewer channels: who answers a review interrupt.

``auto``, ``tty`` and ``none`` live in ``base``; ``slack`` in its own module (imported only when chosen,
so the core needs no Slack packages).
"""

from __future__ import annotations

from typing import Any

from mart.graph.reviewers.base import AutoReviewer, DetachReviewer, Reviewer, TTYReviewer

__all__ = ["Reviewer", "make_reviewer"]


def make_reviewer(approve: str, *, auto_policy: str = "all", **options: Any) -> Reviewer:
    if approve == "auto":
        return AutoReviewer(auto_policy)
    if approve == "tty":
        return TTYReviewer()
    if approve == "none":
        return DetachReviewer()
    if approve == "slack":
        from mart.graph.reviewers.slack import SlackReviewer

        return SlackReviewer(**options)
    raise ValueError(f"unknown reviewer channel {approve!r}: use auto, tty, none or slack")
