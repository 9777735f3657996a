"""The stages of a tuning session: one policy object per stage behind one protocol (``StagePolicy``).

``get(name)`` returns a stage's policy; ``session_stages(options)`` the stages a session runs, in order. Stage
control (``mart.nodes.stage_control``) runs the protocol; see ``_base`` for what a stage decides.
"""

from __future__ import annotations

from typing import Any

from mart.nodes.stages._base import Plan, StagePolicy, StageView
from mart.nodes.stages.learning import LearningStage
from mart.nodes.stages.schedule import ScheduleStage
from mart.nodes.stages.system import SystemStage
from mart.state.stages import STAGE_ORDER, register_traits, unregister_traits

#: the registered stages, by name (their order is ``mart.state.stages.STAGE_ORDER``)
STAGES: dict[str, StagePolicy] = {}


def register(policy: StagePolicy, *, after: str | None = None) -> None:
    """Add a stage: its policy here, its name and traits to the vocabulary (``mart.state.stages``), after the
    stage ``after`` (by default last). A session runs it once ``TuneOptions.stages`` names it."""
    register_traits(policy.name, policy.traits, after=after)
    STAGES[policy.name] = policy


def unregister(name: str) -> None:
    """Remove a stage added by ``register`` (a test's toy stage)."""
    STAGES.pop(name, None)
    unregister_traits(name)


for _policy in (SystemStage(), LearningStage(), ScheduleStage()):
    register(_policy)


def get(stage: str) -> StagePolicy:
    """The policy of ``stage``."""
    try:
        return STAGES[stage]
    except KeyError:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}") from None


def session_stages(options: Any) -> list[str]:
    """The stages this session runs, in order (stage 2 with a zero budget is skipped)."""
    stages = getattr(options, "stages", None) or ["system", "learning"]
    return [s for s in stages if options.runs_stage(s)] if hasattr(options, "runs_stage") else list(stages)


def next_stage(options: Any, stage: str) -> str | None:
    order = session_stages(options)
    later = [s for s in order if STAGE_ORDER.index(s) > STAGE_ORDER.index(stage)]
    return later[0] if later else None


__all__ = ["Plan", "STAGES", "StagePolicy", "StageView", "get", "next_stage", "register", "session_stages",
           "unregister"]
