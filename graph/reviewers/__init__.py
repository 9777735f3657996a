"""Reviewer channels: who answers a review interrupt (tty, auto, none; slack in its own module)."""

from graph.reviewers.base import Reviewer, make_reviewer

__all__ = ["Reviewer", "make_reviewer"]
