"""The stage protocol: one policy object per stage of a session, and the view of the session it decides from.

A stage answers five questions, whatever it tunes:

* ``plan(view, free)``: what to start now in the ``free`` trial slots: trials of its own (a baseline, a
  re-evaluation, an unchanged continuation), a number of candidates for the agents to propose (one review covers
  them), a profile to build first, or nothing (wait for a running trial), or that it is done;
* ``collected(view, record, eligible)``: how one of its finished trials updates it (the incumbent best);
* ``conclude(view, note)``: how it picks its winner once nothing of it runs, and what it records;
* ``summary(state, services)``: what it reports in the session's summary;
* ``base_config`` / ``overrides_of`` / ``prepare`` / ``review_context``: what its candidates apply to, what a
  trial changes, how a trial is launched, what a reviewer sees besides the candidate.

Several trials may be in flight at once (``TuneOptions.parallel``): ``plan`` sees them (``view.running``) and
never starts more than ``free``. Every decision is recomputed from the ledger and the small graph state, so a
session resumed after a crash decides the same. Stage control (``mart.nodes.stage_control``) only runs this
protocol; adding a stage is one module with a ``StagePolicy`` subclass plus its registration
(``mart.nodes.stages.register``, which adds its name and ``StageTraits`` to ``mart.state.stages``).
"""

from __future__ import annotations

import abc
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from mart.nodes.health_monitor import STOP_PREFIX
from mart.state.graph_state import running_trials
from mart.state.metrics import StepRecord
from mart.state.models import TrialRecord, config_hash
from mart.state.objectives import learning_score, system_outcome, unscored_reason
from mart.state.search_space import ConfigError
from mart.state.stages import StageName, StageTraits
from mart.state.trials import RunningTrial

if TYPE_CHECKING:
    from mart.nodes.agents.base import AgentContext


@dataclass
class Plan:
    """A stage's answer to "what now?" for the free slots (``launch`` + ``propose`` never exceed them)."""

    launch: list[TrialRecord] = field(default_factory=list)
    """Trials to start without a review: a baseline, a re-evaluation, an unchanged continuation."""
    propose: int = 0
    """Candidates to ask the agents for; one review covers them."""
    profile: bool = False
    """The baseline has finished: build the stage's phase profile before anything else."""
    done: bool = False
    """Nothing more to start: once nothing of the stage runs, it concludes."""
    update: dict[str, Any] = field(default_factory=dict)
    """State the stage keeps with this decision (e.g. the schedule's node being expanded)."""
    stop: dict[str, str] = field(default_factory=dict)
    """Running trials to stop now (trial id -> why): their slots free for the next decision."""

    @property
    def waits(self) -> bool:
        """Nothing to start now, and not done: wait for a running trial to finish."""
        return not (self.launch or self.propose or self.profile or self.done or self.stop)


@dataclass
class Outcome:
    """A finished trial's objective as its stage measures it (``StagePolicy.outcome``)."""

    fields: dict[str, Any]
    """The record's objective fields (``throughput``/``score``, ``peak_memory_gb``)."""
    feasible: bool = True
    """False: it broke the stage's constraint (stage 1: above the memory margin) and may not become its best."""
    infeasible_reason: str | None = None
    """The ledger's reason for that, when the trial gives none of its own."""
    unscored: str | None = None
    """A completed trial without its objective: why (a warning, and part of its reason)."""


def finite(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) else float(v)


class StageView:
    """What a policy decides from: the graph state, the services, and the trials in flight."""

    def __init__(self, state: Mapping[str, Any], services: Any) -> None:
        self.state = state
        self.services = services
        self.options = services.options
        self.ledger = services.ledger

    def running(self, stage: str | None = None) -> list[RunningTrial]:
        """The trials in flight (launched), in launch order."""
        return running_trials(self.state, stage)

    def queued(self, stage: str | None = None) -> list[TrialRecord]:
        """Trials decided but not launched yet."""
        return [TrialRecord.model_validate(r) if isinstance(r, dict) else r for r in (self.state.get("queue") or [])
                if stage is None or (r.stage if isinstance(r, TrialRecord) else r.get("stage")) == stage]

    def rows(self, stage: str) -> list[dict[str, Any]]:
        """The ledger's rows of the stage's trials (launched ones, running or finished), in launch order."""
        return self.ledger.trials(stage)

    def launched(self, stage: str, *, kinds: tuple[str, ...] | None = None) -> int:
        """Trials of the stage started or decided so far (the ledger's, plus the queue), optionally of some kinds."""
        ids = {r["trial_id"] for r in self.rows(stage) if kinds is None or r.get("kind") in kinds}
        ids |= {r.trial_id for r in self.queued(stage) if kinds is None or r.kind in kinds}
        return len(ids)

    def in_flight(self, stage: str | None = None) -> int:
        return len(self.running(stage)) + len(self.queued(stage))

    def out_of_time(self) -> bool:
        limit = self.options.wall_clock_s
        return bool(limit) and time.time() - self.state.get("started_at", time.time()) > limit

    def exhausted(self, stage: str) -> str | None:
        return (self.state.get("exhausted") or {}).get(stage)

    def waiting(self, stage: str) -> str | None:
        return (self.state.get("waiting") or {}).get(stage)

    def next_seq(self) -> int:
        """The sequence number the next decided trial gets."""
        return int(self.state.get("trial_seq", 0)) + len(self.state.get("queue") or []) + 1


#: how a trial that was killed from outside ends (not by its own config): worth one more run of a baseline
_KILLED = ("killed", "signal", "without writing a status", "watchdog", "lost")


def killed(record: TrialRecord) -> bool:
    """The trial ended failed or stopped by something outside its config (``_KILLED``), not by mart's health
    monitor or an OOM."""
    reason = (record.reason or "").lower()
    return (record.status.value in ("failed", "stopped") and not reason.startswith(STOP_PREFIX)
            and any(word in reason for word in _KILLED))


class StagePolicy(abc.ABC):
    """One stage of a session (see the module docstring)."""

    name: ClassVar[StageName]
    objective: ClassVar[str]
    """The stage's objective in words, for the agents."""
    traits: ClassVar[StageTraits]
    """What the lower layers know of it (``mart.state.stages``): registered with the policy."""

    # -- what its trials are ----------------------------------------------------------------------
    @abc.abstractmethod
    def budget(self, options: Any) -> int:
        """Trials the stage may start (its baseline included)."""

    @abc.abstractmethod
    def horizon(self, options: Any) -> int:
        """Steps of one of its trials (the schedule stage: the last global step of a schedule)."""

    def max_reruns(self, options: Any) -> int:
        """The most re-runs (``confirm`` trials) it may start beside its budget (the session's ETA counts them as
        the upper end of its range). Default: none."""
        return 0

    def base_config(self, view: StageView) -> dict[str, Any]:
        """The full config its candidates apply to: the backend's base with the session's ``--set`` values."""
        base = dict(view.services.backend.base_config())
        base.update(getattr(view.options, "start_overrides", None) or {})
        return base

    def overrides_of(self, view: StageView, record: TrialRecord) -> dict[str, Any]:
        """The knobs a trial changes against the stage's base config."""
        base = self.base_config(view)
        return {k: v for k, v in record.config.items() if base.get(k, object()) != v}

    def current_config(self, view: StageView, record: TrialRecord) -> dict[str, Any]:
        """What a trial being launched changes against (its progress line's changes): the stage's current best."""
        return {**self.base_config(view), **(view.state.get("best_overrides") or {}).get(self.name, {})}

    def baseline_record(self, view: StageView) -> TrialRecord:
        """The stage's first trial: its base config as it is."""
        return TrialRecord(trial_id=f"{self.name[:3]}-{view.next_seq():02d}-baseline", stage=self.name,
                           kind="baseline", config=self.base_config(view))

    def baseline_retry_record(self, view: StageView) -> TrialRecord:
        """The baseline's one re-run (after a kill from outside, or stage 1's cut when nothing else stayed
        feasible): the same config, its own trial id."""
        return self.baseline_record(view).model_copy(update={
            "trial_id": f"{self.name[:3]}-{view.next_seq():02d}-baseline-retry"})

    def outcome(self, services: Any, records: list[StepRecord], horizon: int, *, completed: bool) -> Outcome:
        """A finished trial's objective from its metric records. Default (a score stage): the final validation
        score (a completed trial without one is ``unscored``) and the peak memory, no constraint on it."""
        prefix = services.backend.score_metric_prefix
        score = finite(learning_score(records, prefix))
        fields = {"score": score, "peak_memory_gb": finite(system_outcome(records, horizon, None).peak_memory_gb)}
        return Outcome(fields, unscored=unscored_reason(records, prefix) if score is None and completed else None)

    def prepare(self, view: StageView, record: TrialRecord) -> tuple[TrialRecord, int]:
        """The record as launched (with anything the stage fills in) and its last step."""
        return record, self.horizon(view.options)

    # -- decisions --------------------------------------------------------------------------------
    def enter(self, view: StageView) -> dict[str, Any]:
        """State the stage starts with (beyond the session's per-stage counters)."""
        return {}

    def bets_beside_baseline(self, view: StageView) -> bool:
        """Whether candidates may start in the other slots while the baseline runs (several slots only). Default:
        no; a stage whose agents can propose before the baseline's profile says yes."""
        return False

    def look_at(self, view: StageView, record: TrialRecord) -> int | None:
        """The step of a trial being launched after which the stage wants to decide again while it runs (an early
        look: the watch hands control back once that step is logged), or None. Default: none."""
        return None

    def baseline_plan(self, view: StageView, free: int = 0) -> Plan | None:
        """The part every stage shares: the baseline first, then its profile; None once both are done. With one
        slot the baseline runs alone; with several, a stage that allows it (``bets_beside_baseline``) fills the
        other slots with candidates at once rather than leave them idle for a whole trial."""
        baseline = (view.state.get("baseline") or {}).get(self.name)
        if baseline is not None and killed(baseline) and view.launched(self.name, kinds=("baseline",)) == 1:
            # a baseline killed from outside (a signal, a lost node, the watchdog) says nothing of its config:
            # it runs once more before the stage gives up on it (an OOM or a crash would only repeat)
            return Plan(launch=[self.baseline_retry_record(view)])
        in_flight = any(r.record.kind == "baseline" for r in view.running(self.name)) or any(
            r.kind == "baseline" for r in view.queued(self.name))
        if baseline is None or in_flight:
            if baseline is None and view.launched(self.name, kinds=("baseline",)) == 0:
                return Plan(launch=[self.baseline_record(view)])
            left = self.budget(view.options) - view.launched(self.name, kinds=("baseline", "candidate"))
            if free > 0 and left > 0 and self.bets_beside_baseline(view) and not view.waiting(self.name) \
                    and not view.exhausted(self.name):
                return Plan(propose=min(free, left))
            return Plan()  # the baseline runs: what comes next needs its result
        if self.name not in (view.state.get("profiles") or {}):
            return Plan(profile=True)
        return None

    @abc.abstractmethod
    def plan(self, view: StageView, free: int) -> Plan:
        """What to start in the ``free`` slots now (see ``Plan``)."""

    def collected(self, view: StageView, record: TrialRecord, eligible: bool) -> dict[str, Any]:
        """The state update after one of its trials finished (``record``: its result). Default: an eligible
        baseline or candidate with a better objective than the incumbent replaces it. With several slots the
        baseline can end after candidates that ran beside it: it is the reference, not the incumbent by right."""
        best = dict(view.state.get("best") or {})
        best_overrides = dict(view.state.get("best_overrides") or {})
        update: dict[str, Any] = {}
        stage = self.name
        if record.kind == "baseline":
            update["baseline"] = {**(view.state.get("baseline") or {}), stage: record.brief()}
        if record.kind in ("baseline", "candidate") and eligible and record.objective(stage) is not None:
            incumbent = best.get(stage)
            if incumbent is None or incumbent.objective(stage) is None or \
                    record.objective(stage) > incumbent.objective(stage):
                best[stage] = record.brief()
                best_overrides[stage] = {} if record.kind == "baseline" else self.overrides_of(view, record)
        return {**update, "best": best, "best_overrides": best_overrides}

    def compared_to(self, view: StageView, record: TrialRecord) -> tuple[float | None, str]:
        """What a finished trial's objective is compared with in progress output: the stage's best so far."""
        best = (view.state.get("best") or {}).get(self.name)
        return (best.objective(self.name) if best is not None else None), "best"

    @abc.abstractmethod
    def conclude(self, view: StageView, note: str | None) -> tuple[dict[str, Any], str | None]:
        """Pick the winner once nothing of the stage runs and record it; returns the state update and, when the
        session must not go on to later stages, why."""

    def record_result(self, view: StageView, note: str | None) -> None:
        """The stage's row in the ledger's ``stage_results`` (baseline and best)."""
        state = view.state
        base: TrialRecord | None = (state.get("baseline") or {}).get(self.name)
        best: TrialRecord | None = (state.get("best") or {}).get(self.name)
        if base is None:
            return
        baseline_value, best_value = self.result_values(state)
        view.ledger.set_stage_result(
            view.services.run_id, self.name, baseline_trial=base.trial_id, best_trial=best.trial_id if best else None,
            baseline_value=baseline_value, best_value=best_value,
            best_config=(state.get("best_overrides") or {}).get(self.name, {}), note=note or "",
        )

    def result_values(self, state: Mapping[str, Any]) -> tuple[float | None, float | None]:
        """The baseline's and the best's objective as the stage reports them (its summary, the ledger's
        ``stage_results``, hence the report): one figure per concept. Default: each trial's own objective."""
        base = (state.get("baseline") or {}).get(self.name)
        best = (state.get("best") or {}).get(self.name)
        return (base.objective(self.name) if base else None), (best.objective(self.name) if best else None)

    # -- what the agents ask (``ctx``: their ``mart.nodes.agents.base.AgentContext``) ---------------
    start_words: ClassVar[str] = "current best configuration"
    """What a candidate's changes apply to, in words ("changes nothing relative to the ...")."""
    tried_words: ClassVar[str] = "in this stage"
    """Where a config counts as tried, in words ("already tried ...")."""
    tried_scope: ClassVar[str] = ""
    """The same, when narrower than the stage (" from this checkpoint"), or nothing."""

    def proposal_start(self, ctx: AgentContext) -> dict[str, Any]:
        """The overrides a proposal's changes go on top of: the stage's best so far."""
        return dict(ctx.best_overrides)

    def implied(self, ctx: AgentContext, changes: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """``changes`` with what they imply, and those moves in words. Default: nothing."""
        return changes, []

    def stage_refusals(self, ctx: AgentContext, overrides: dict[str, Any]) -> list[str]:
        """Why the stage refuses a candidate beyond its knob catalogue and the backend's rules. Default: never."""
        return []

    def duplicate(self, key: str, tried: set[str], siblings: set[str]) -> str | None:
        """Why a candidate (``key``: its full config's hash) is a duplicate, or None: a config already tried
        (``AgentContext.tried_keys``); ``siblings`` are the candidates judged before it in this round."""
        return f"duplicate of a config already tried {self.tried_words}" if key in tried else None

    def admissible(self, ctx: AgentContext, overrides: dict[str, Any], *, tried: set[str] | None = None,
                   siblings: set[str] | None = None) -> list[str]:
        """Why a candidate may not run in this stage (empty: it may), in the order a reviewer reads them: knobs
        outside the stage's catalogue or invalid values, the stage's own rule (``stage_refusals``), the backend's
        constraints (only on well-typed overrides), a duplicate (``duplicate``). The memory rule is the
        critic's, from ``memory_reference``."""
        reasons: list[str] = []
        try:
            ctx.search_space.validate_overrides(overrides, stage=self.name)
        except ConfigError as e:
            reasons.append(str(e))
        reasons += self.stage_refusals(ctx, overrides)
        if not reasons:  # the backend's check (verl's validate_config) only on well-typed overrides
            reasons += ctx.config_errors(overrides)
        why = self.duplicate(config_hash(ctx.full_config(overrides)),
                             ctx.tried_keys() if tried is None else tried, set() if siblings is None else siblings)
        return [*reasons, why] if why else reasons

    def memory_reference(self, ctx: AgentContext) -> float | None:
        """The predicted peak a candidate's own memory is measured from: None when the whole peak counts (a
        memory-bound stage), else the base config's (the system config is fixed: only memory a candidate adds
        can be held against it)."""
        return None if self.traits.memory_bound else ctx.predict_memory(ctx.base_config)

    # -- what people see --------------------------------------------------------------------------
    def review_context(self, view: StageView) -> dict[str, Any]:
        """Fields a review request of this stage carries besides its candidates."""
        return {}

    @abc.abstractmethod
    def summary(self, state: Mapping[str, Any], services: Any) -> tuple[dict[str, Any], list[str]]:
        """The stage's part of the session summary (``{key: part}``) and its notes."""


def give_up(view: StageView, stage: str, reason: str) -> dict[str, Any]:
    """The agents found nothing (new) to propose: with trials of the stage in flight, wait for one of them to
    finish and ask again (``waiting``); with none, the stage has nothing left to try (``exhausted``)."""
    key = "waiting" if view.in_flight(stage) else "exhausted"
    return {key: {**(view.state.get(key) or {}), stage: reason}, "batch": None}
