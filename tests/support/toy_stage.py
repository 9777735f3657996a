"""A toy fourth stage, written as a contributor would add one: this module plus ``register`` (see
``tests/graph/test_toy_stage.py``). It re-tunes the learning knobs on a short horizon for the validation score,
from the base config with the best system overrides (the learning stage's traits), with the protocol's defaults
wherever they fit: baseline first, then proposals for the free slots while its budget lasts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mart.nodes.stages import Plan, StagePolicy, StageView
from mart.nodes.stages.system import candidate_plan
from mart.state.stages import StageTraits

TOY_BUDGET = 3
TOY_HORIZON = 4


class ToyStage(StagePolicy):
    name = "toy"
    traits = StageTraits(objective="score")  # learning knobs, the system config fixed, watched as learning
    objective = "maximise the validation score of a short run"

    def budget(self, options: Any) -> int:
        return TOY_BUDGET

    def horizon(self, options: Any) -> int:
        return TOY_HORIZON

    def base_config(self, view: StageView) -> dict[str, Any]:
        return {**super().base_config(view), **(view.state.get("best_overrides") or {}).get("system", {})}

    def plan(self, view: StageView, free: int) -> Plan:
        return self.baseline_plan(view, free) or candidate_plan(
            view, self.name, self.budget(view.options), free, kinds=("baseline", "candidate"))

    def conclude(self, view: StageView, note: str | None) -> tuple[dict[str, Any], str | None]:
        self.record_result(view, note)
        return {}, None

    def summary(self, state: Mapping[str, Any], services: Any) -> tuple[dict[str, Any], list[str]]:
        base, best = self.result_values(state)
        return {self.name: {"baseline_score": base, "best_score": best,
                            "best_config": (state.get("best_overrides") or {}).get(self.name, {})}}, []
