"""The stage vocabulary every layer speaks: a stage's name, the order stages run in, and the few facts about a
stage that the lower layers (records, health rules, knob catalogues, backends) read.

A stage's behaviour is its policy (``mart.nodes.stages``); what lives here is only what ``state`` and
``trial_runner`` need without importing a policy. A stage declares its ``StageTraits`` on its policy class and
``mart.nodes.stages.register`` adds both: the shipped stages are registered at import, a new stage is one module
plus that call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator

#: the shipped stages' names (a registered stage beyond them is a plain ``str`` to the type checker)
ShippedStage = Literal["system", "learning", "schedule"]

#: the knob catalogues a knob belongs to (``ParamSpec.stage``): every stage's candidates change knobs of these
KnobStage = Literal["system", "learning"]


@dataclass(frozen=True)
class StageTraits:
    """What the lower layers know of a stage.

    Args:
        objective: what one of its trials is judged by: ``throughput`` (the metric ``perf/throughput``, the
            trial's validations off) or ``score`` (the final validation score).
        memory_bound: its trials must stay within the session's GPU-memory margin to count, and its memory
            predictions are a full step's (not only what a candidate adds to a fixed system config).
        knobs: the knob catalogues its candidates change.
        flagged_knobs: it also changes the system knobs flagged ``schedule`` (token caps a longer response limit
            implies; ``ParamSpec.schedule``).
        branches: its trials grow as a tree from checkpoints of earlier ones (a candidate changes its parent
            branch's config, duplicates are judged per checkpoint, token caps move only up).
        fixes_system: its base config carries the best system overrides of an earlier stage.
        confirms: its close contenders are re-run on other seeds (``confirm`` trials) before a winner is taken, so
            its figures are means over seeds.
        remeasures: its best is re-measured interleaved with its baseline (``confirm`` trials) before it is taken,
            and its gain's interval comes from those fresh measurements, not from the one that selected it.
    """

    objective: Literal["throughput", "score"]
    memory_bound: bool = False
    knobs: tuple[KnobStage, ...] = ("learning",)
    flagged_knobs: bool = False
    branches: bool = False
    fixes_system: bool = True
    confirms: bool = False
    remeasures: bool = False

    @property
    def health_rules(self) -> KnobStage:
        """The health rules its trials are watched with (``mart.state.health.HealthRule.stages``)."""
        return "system" if self.objective == "throughput" else "learning"


SYSTEM_TRAITS = StageTraits(objective="throughput", memory_bound=True, knobs=("system",), fixes_system=False,
                            remeasures=True)
LEARNING_TRAITS = StageTraits(objective="score", confirms=True)
SCHEDULE_TRAITS = StageTraits(objective="score", flagged_knobs=True, branches=True)

#: the registered stages' traits, in the order a session runs them (``TuneOptions.stages`` keeps this order)
_TRAITS: dict[str, StageTraits] = {"system": SYSTEM_TRAITS, "learning": LEARNING_TRAITS, "schedule": SCHEDULE_TRAITS}
#: the stages in the order a session runs them; extended by ``register_traits``
STAGE_ORDER: list[str] = list(_TRAITS)
#: the stages a session runs when none are named
DEFAULT_STAGES: tuple[ShippedStage, ...] = ("system", "learning")


def register_traits(name: str, traits: StageTraits, *, after: str | None = None) -> None:
    """Add a stage (after ``after``, by default last) or replace a registered stage's traits."""
    _TRAITS[name] = traits
    if name not in STAGE_ORDER:
        STAGE_ORDER.insert(STAGE_ORDER.index(after) + 1 if after else len(STAGE_ORDER), name)


def unregister_traits(name: str) -> None:
    """Remove a stage added by ``register_traits`` (a test's toy stage)."""
    _TRAITS.pop(name, None)
    if name in STAGE_ORDER:
        STAGE_ORDER.remove(name)


def traits(stage: str) -> StageTraits:
    """The traits of a registered stage."""
    try:
        return _TRAITS[stage]
    except KeyError:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGE_ORDER)}") from None


def measures_throughput(stage: str | None) -> bool:
    """A trial of ``stage`` is judged by its throughput (a standalone trial, ``None``, is not)."""
    return stage is not None and traits(stage).objective == "throughput"


def memory_bound(stage: str | None) -> bool:
    """A trial of ``stage`` must stay within the memory margin to count (``StageTraits.memory_bound``)."""
    return stage is not None and traits(stage).memory_bound


def branches(stage: str | None) -> bool:
    """``stage`` grows its trials as a tree from checkpoints (``StageTraits.branches``)."""
    return stage is not None and traits(stage).branches


def known_stage(stage: str) -> str:
    """``stage`` if it is registered (pydantic's check of a stage field, worded as its check of a ``Literal``)."""
    if stage not in _TRAITS:
        names = [repr(s) for s in STAGE_ORDER]
        raise ValueError(f"Input should be {', '.join(names[:-1])} or {names[-1]}" if len(names) > 1
                         else f"Input should be {names[0]}")
    return stage


#: a stage's name in a record: a registered stage (checked when the record is built)
StageName = Annotated[str, AfterValidator(known_stage)]
