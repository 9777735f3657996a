"""Choosing several candidates at once, for several free trial slots: best first, each next one spread away from
the ones already chosen and from the trials still running.

The rule is local penalization (González et al., "Batch Bayesian Optimization via Local Penalization", AISTATS
2016, arXiv 1505.08052): a candidate's score is multiplied, for every chosen or running config, by
``1 - exp(-d^2)`` with ``d`` their distance in knob steps (one doubling of a numeric knob, or one change of a
categorical one, is 1). Near-copies of a config whose result is still unknown are worth little: if the model is
wrong about one, it is wrong about the other. It is the believer view of Optuna's constant liar
(``TPESampler(constant_liar=True)``): a running trial's outcome is taken as predicted, so what the batch still
gains is what lies elsewhere. A batch of one is the best candidate, unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any


def knob_distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """How far two configs are apart: per knob that differs, |log2| of the ratio for positive numbers (at least 1
    for any change: x2 = 1, x4 = 2), else 1."""
    total = 0.0
    for key in set(a) | set(b):
        x, y = a.get(key), b.get(key)
        if x == y:
            continue
        if (isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool)
                and not isinstance(y, bool) and x > 0 and y > 0):
            total += max(1.0, abs(math.log2(x / y)))
        else:
            total += 1.0
    return total


#: the distance (knob steps) at which a candidate keeps 63% of its score next to a chosen or running config
SPREAD = 2.0


#: the relative change of a phase's predicted time that counts as one step of the model distance (about the job
#: model's own error on an untested config): configs whose phases the model predicts alike teach it the same thing
PHASE_STEP = 0.1


def phase_distance(a: dict[str, float], b: dict[str, float]) -> float:
    """How far apart two configs are in what the job model predicts of them: per phase, |ln| of the ratio of the
    predicted times over ``PHASE_STEP``, summed (configs that differ only in knobs that change no phase are close)."""
    total = 0.0
    for p in set(a) | set(b):
        x, y = a.get(p, 0.0), b.get(p, 0.0)
        if x > 0 and y > 0:
            total += abs(math.log(x / y)) / PHASE_STEP
        elif x != y:
            total += 1.0
    return total


def penalty(distance: float) -> float:
    """0 for the same config; 0.22 one step away, 0.63 two, 0.89 three (``SPREAD`` = 2)."""
    return 1.0 - math.exp(-(distance / SPREAD) ** 2)


def select_batch(scored: Sequence[tuple[Any, float, dict[str, Any]]], k: int,
                 anchors: Sequence[dict[str, Any]] = (), distance: Callable[[Any, Any], float] = knob_distance
                 ) -> list[Any]:
    """Up to ``k`` items of ``scored`` = ``(item, score, point)``, greedily: the highest score discounted by its
    ``distance`` to the anchors (running trials) and to the items already chosen (points: full configs for
    ``knob_distance``, predicted phase times for ``phase_distance``). Items with a score <= 0, or discounted to 0
    (a copy of a chosen or running config), are never chosen; ties keep ``scored``'s order."""
    chosen: list[Any] = []
    taken: list[dict[str, Any]] = list(anchors)
    left = [(item, score, cfg) for item, score, cfg in scored if score > 0]
    while left and len(chosen) < k:
        best_i, best_v = -1, 0.0
        for i, (_, score, cfg) in enumerate(left):
            v = score
            for other in taken:
                v *= penalty(distance(cfg, other))
            if v > best_v:
                best_i, best_v = i, v
        if best_i < 0:
            break
        item, _, cfg = left.pop(best_i)
        chosen.append(item)
        taken.append(cfg)
    return chosen
