"""Memory model used by the critic: predicts a config's peak memory from the trials seen so far.

Peak memory scales with a knob as ``value ** elasticity`` (booleans: a factor). Elasticities start from
priors (the knobs' records, ``knob_effects``) and are replaced by what pairs of trials that differ in exactly
that knob measured. A prediction starts from the nearest measured config and applies the differing knobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mart.nodes.knob_effects import KnobEffect, effect_of
from mart.state.models import TrialRecord, TrialStatus
from mart.state.search_space import ParamSpec


def _ratio(a: Any, b: Any) -> float | None:
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return None
    return a / b if a > 0 and b > 0 else None


@dataclass
class MemoryModel:
    observations: list[tuple[dict[str, Any], float]] = field(default_factory=list)
    learned: dict[str, float] = field(default_factory=dict)
    capacity_gb: float | None = None
    effects: dict[str, KnobEffect] = field(default_factory=dict)
    """The priors of the knobs given as records (a bare key's: ``effect_of(key)``)."""

    @classmethod
    def fit(cls, history: list[TrialRecord], keys: list[str] | list[ParamSpec],
            capacity_gb: float | None = None) -> "MemoryModel":
        """Fit on the trials; ``keys``: the catalogue's keys, or its records (whose effects are the priors)."""
        effects = {k.key: effect_of(k) for k in keys if isinstance(k, ParamSpec)}
        keys = [k.key if isinstance(k, ParamSpec) else k for k in keys]
        obs = []
        for t in history:
            peak = t.peak_memory_gb
            if t.status is TrialStatus.OOM and capacity_gb is not None:
                peak = max(peak or 0.0, capacity_gb)  # an OOM config needs at least the capacity
            if peak is not None and math.isfinite(peak) and peak > 0:
                obs.append(({k: t.config.get(k) for k in keys}, peak))
        model = cls(observations=obs, capacity_gb=capacity_gb, effects=effects)
        for i, (ca, pa) in enumerate(obs):
            for cb, pb in obs[i + 1:]:
                diff = [k for k in keys if ca.get(k) != cb.get(k)]
                if len(diff) != 1:
                    continue
                key = diff[0]
                if isinstance(ca[key], bool) or isinstance(cb[key], bool):
                    # factor for turning the knob on
                    on, off = (pa, pb) if ca[key] else (pb, pa)
                    model.learned[key] = on / off
                else:
                    r = _ratio(ca[key], cb[key])
                    if r and abs(math.log(r)) > 1e-9:
                        model.learned[key] = math.log(pa / pb) / math.log(r)
        return model

    def predict(self, config: dict[str, Any]) -> float | None:
        if not self.observations:
            return None

        def distance(obs_cfg: dict[str, Any]) -> int:
            return sum(1 for k, v in obs_cfg.items() if config.get(k) != v)

        ref_cfg, ref_peak = min(self.observations, key=lambda o: distance(o[0]))
        pred = ref_peak
        for key, ref_value in ref_cfg.items():
            value = config.get(key)
            if value == ref_value:
                continue
            eff = self.effects.get(key) or effect_of(key)
            if isinstance(value, bool) or isinstance(ref_value, bool):
                factor = self.learned.get(key, eff.memory_factor_on)
                pred *= factor if value else 1.0 / factor
            else:
                r = _ratio(value, ref_value)
                if r is None:  # e.g. null -> number: unknown, assume the prior doubling effect
                    continue
                pred *= r ** self.learned.get(key, eff.memory_elasticity)
        return pred
