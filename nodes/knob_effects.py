"""What the agents know about a knob, read off its catalogue record (``ParamSpec``: effect, prior, move rule,
aliases).

A record that leaves a fact unset means the verl knob its key names (the local workload's and a plugin's knobs
speak verl's keys; each agent's copy ``agents.<i>.<key>`` is that knob for one agent), or the one its ``means``
names (another backend's name for a verl knob: MARTI's), so every fact is written once, in the verl catalogue's record (``mart.trial_runner.verl.space``) or in the shared workflow knobs'
(``mart.state.agents``). ``KnobEffect``: ``phase`` is the step phase the knob mainly speeds up; ``faster`` the
direction that speeds it up ("up"/"down" for numbers, True/False for switches); ``memory_elasticity`` how peak
memory scales with a numeric knob (peak ∝ value ** e); ``memory_factor_on`` the memory factor of turning a switch
on (sources: verl's perf-tuning guide, docs/agents.md). Unknown knobs get a neutral effect.
"""

from __future__ import annotations

import dataclasses

from mart.state.agents import ASYNC_TASKS_PARAM, NUM_ROUNDS_PARAM
from mart.state.search_space import NEUTRAL_EFFECT, KnobEffect, ParamSpec
from mart.trial_runner.verl.space import SEARCH_SPACE as VERL_SPACE

__all__ = ["FACTS", "KnobEffect", "effect_of", "knob_facts", "reference_record"]

#: the fields of a record that say what the tuner knows about the knob. ``model`` only passes to a record of the
#: same key (the job model reads verl's keys, a per-agent copy's too), never to another backend's name for it.
FACTS = ("effect", "model", "prior", "move", "zero_start", "aliases", "phases")

#: the records that define the facts, by their key without verl's ``actor_rollout_ref.`` prefix
_REFERENCE: dict[str, ParamSpec] = {
    p.key.removeprefix("actor_rollout_ref."): p for p in (*VERL_SPACE.params, ASYNC_TASKS_PARAM, NUM_ROUNDS_PARAM)
}


def reference_record(key: str) -> ParamSpec | None:
    """The verl (or shared workflow) record a key names: the one its key ends with (at a dot)."""
    for suffix, spec in _REFERENCE.items():
        if key == suffix or key.endswith("." + suffix):
            return spec
    return None


def knob_facts(spec: ParamSpec) -> ParamSpec:
    """``spec`` with the facts it leaves unset taken from the record it means (``means``, else its key)."""
    ref = reference_record(spec.means or spec.key)
    if ref is None or ref is spec:
        return spec
    facts = FACTS if spec.means is None else tuple(f for f in FACTS if f != "model")
    missing = {f: getattr(ref, f) for f in facts if getattr(spec, f) in (None, ()) and getattr(ref, f) not in (None, ())}
    return dataclasses.replace(spec, **missing) if missing else spec


def effect_of(knob: ParamSpec | str) -> KnobEffect:
    """The effect of a knob (a record, or a bare key: the record it names)."""
    if isinstance(knob, ParamSpec):
        return knob_facts(knob).known_effect
    ref = reference_record(knob)
    return ref.known_effect if ref is not None else NEUTRAL_EFFECT
