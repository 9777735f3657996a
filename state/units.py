"""How quantities are written for people, one rule per unit (console, reviews, Slack, report)."""

from __future__ import annotations

import math


def fmt_steps(first: int, last: int) -> str:
    """A range of training steps: ``step 2``, ``steps 2-4``."""
    return f"step {first}" if first == last else f"steps {first}-{last}"


def fmt_gb(value: float | None, unknown: str = "?") -> str:
    """Memory in GB with enough digits at every scale: ``70.12 GB``, ``0.0751 GB`` (the CPU workload's peaks are
    tens of MB: two decimals would print them as ``0.07`` or ``0.00``)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return unknown
    return f"{value:.2f} GB" if abs(value) >= 1 or value == 0 else f"{value:.3g} GB"
