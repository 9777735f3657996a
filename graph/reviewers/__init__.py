"""Reviewer channels: who answers a review interrupt (tty, auto, none; slack in its own module)."""

from mart.graph.reviewers.base import Reviewer, make_reviewer

__all__ = ["Reviewer", "make_reviewer"]
