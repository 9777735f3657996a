"""The strategy interface of the two agents. A node builds a context, a strategy answers.

Strategies are pure with respect to the graph: they read the context and return models; the nodes
record what they returned in the ledger and put the small parts in graph state.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel, Field

from mart.nodes import stages
from mart.state.models import Candidate, Critique, HealthEvent, Profile, TrialRecord, config_hash
from mart.state.search_space import SearchSpace
from mart.state.stages import StageName, StageTraits, traits

if TYPE_CHECKING:
    from mart.nodes.agents.schedule import Diagnosis
    from mart.nodes.stages import StagePolicy


@dataclass
class AgentContext:
    """Everything an agent may know when it proposes or critiques (built by the nodes, never stored)."""

    stage: StageName
    objective: str
    search_space: SearchSpace
    base_config: dict[str, Any]
    """The full flat config candidates are applied to (stage 2: with the best system config fixed)."""
    best_overrides: dict[str, Any]
    """Overrides of the best trial of this stage so far (empty = the baseline)."""
    profile: Profile | None
    history: list[TrialRecord]
    health_events: list[HealthEvent] = field(default_factory=list)
    feedback: list[str] = field(default_factory=list)
    """Reviewer feedback and critic reasons from rejected rounds, oldest first."""
    memory_limit_gb: float | None = None
    predict_memory: Callable[[dict[str, Any]], float | None] = lambda config: None
    """Memory model fitted on the trials seen so far: full config -> predicted peak GB (None = unknown)."""
    num_candidates: int = 3
    round: int = 0
    seed: int = 0
    backend: str = "local"
    notes: list[str] = field(default_factory=list)
    """Free-form facts for LLM prompts (e.g. verl's perf-guide ordering)."""
    validate_config: Callable[[dict[str, Any]], list[str]] | None = None
    """The backend's full-config check (constraints, and e.g. verl's own validate_config); None = constraints."""
    rejected: list[dict[str, Any]] = field(default_factory=list)
    """Overrides the reviewer rejected in this stage (never proposed again)."""
    job_model: Any = None
    """The calibrated per-phase model of the job (``mart.nodes.agents.job_model.JobModel``), or None when the
    backend cannot describe its job."""
    predictions: list[dict[str, Any]] = field(default_factory=list)
    """Predicted vs measured throughput and peak of this stage's trials so far (the model's track record)."""
    diagnosis: Diagnosis | None = None
    """Stage ``schedule``: the trajectory so far at the checkpoint the next segment starts from."""
    segment: tuple[int, int] | None = None
    """Stage ``schedule``: (from_step, to_step) of the segment being proposed."""
    horizon: int | None = None
    """Stage ``schedule``: T, the schedule's last global step (a transition's config runs on to it unless a
    later boundary changes it)."""
    slots: int = 1
    """How many trials this decision starts (free slots): the critic picks that many, spread apart."""
    pending: list[TrialRecord] = field(default_factory=list)
    """Trials of this stage still in flight (running or queued): no result yet, never proposed again, and the
    batch keeps its distance from them (their outcome is taken as the model predicts it)."""

    @property
    def policy(self) -> StagePolicy:
        """The stage's policy: what a candidate starts from, what it may change, what counts as a duplicate."""
        return stages.get(self.stage)

    @property
    def traits(self) -> StageTraits:
        """What the stage is (``mart.state.stages``): its objective, whether memory bounds it, whether it branches."""
        return traits(self.stage)

    def predict(self, config: dict[str, Any]) -> Any:
        """The job model's prediction for a full config (throughput, per-phase time and memory, peak,
        confidence, safety gap), or None without a model."""
        if self.job_model is None:
            return None
        try:
            return self.job_model.predict(config)
        except (TypeError, ValueError, KeyError, ZeroDivisionError):
            return None

    def tried_keys(self) -> set[str]:
        """Config hashes never to propose again: every trial run or in flight in this stage and the rejected ones.

        Stage ``schedule``: only the siblings from the same checkpoint (a config run from another checkpoint is no
        duplicate: its weights differ); without ``segment`` every trial of the stage counts."""
        keys = {config_hash(self.full_config(o)) for o in self.rejected} | {config_hash(t.config) for t in self.pending}
        per_checkpoint = self.traits.branches
        frm = self.segment[0] if per_checkpoint and self.segment else None
        for t in self.history:
            if t.stage != self.stage:
                continue
            if not per_checkpoint or frm is None or t.parent_step == frm or (not frm and t.parent_step is None):
                keys.add(config_hash(t.config))
        return keys

    def config_errors(self, overrides: dict[str, Any]) -> list[str]:
        """Everything wrong with a candidate's full config, as the backend sees it."""
        full = self.full_config(overrides)
        if self.validate_config is not None:
            return list(self.validate_config(full))
        return self.search_space.check_constraints(full)

    def full_config(self, overrides: dict[str, Any]) -> dict[str, Any]:
        return {**self.base_config, **overrides}


class CriticVerdict(BaseModel):
    """The critic's answer for one round: one pick, or up to ``ctx.slots`` for a batch."""

    critiques: list[Critique]
    pick: str | None = Field(None, description="candidate_id chosen, or None to send the proposer back")
    picks: list[str] = Field(default_factory=list, description="for a batch (``ctx.slots`` > 1): the candidate_ids "
                             "chosen, best first (``pick`` first); empty = ``[pick]``")
    feedback: str = Field("", description="why none survived (reaches the proposer's next round)")


class AgentCallInfo(BaseModel):
    """What one agent call cost and how it went (recorded in the ledger's agent_calls table)."""

    role: str
    strategy: str
    ok: bool = True
    fallback_reason: str | None = None
    error: str | None = Field(None, description="why this call's answer was not usable (repaired or fallen back)")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    latency_s: float = 0.0
    model: str | None = None
    prompt_version: str | None = None
    attempt: int | None = Field(None, description="1 = the first ask of a round, 2.. = repair turns")
    raw_answer: str | None = Field(None, description="the unusable answer, cut to a few KB (what the model said)")


class Proposer(abc.ABC):
    """Proposes ``ctx.num_candidates`` candidates for the current stage."""

    name: str = "base"

    @abc.abstractmethod
    def propose(self, ctx: AgentContext) -> list[Candidate]: ...

    def answer(self, ctx: AgentContext, candidate: Candidate | None, question: str) -> str:
        """A reviewer's question about a candidate (a ``respond`` decision). Default: what the proposal rests on
        (its rationale, the model's forecast, the trials it is compared with); LLM strategies may ask the model."""
        parts = []
        if candidate is not None:
            parts.append(f"{candidate.candidate_id} ({candidate.source}): {candidate.rationale or 'no rationale given'}")
            if candidate.predicted_throughput is not None:
                parts.append(f"the job model predicts {candidate.predicted_throughput:.0f} tok/s/GPU"
                             + (f" ({candidate.expected_gain:+.1%} over the incumbent)" if candidate.expected_gain
                                is not None else "")
                             + (f" and a peak of {candidate.predicted_memory_gb:.2f} GB" if candidate.predicted_memory_gb
                                is not None else ""))
            elif candidate.expected_gain is not None:
                parts.append(f"its expected gain score is {candidate.expected_gain:.3g}")
        done = [t for t in ctx.history if t.stage == ctx.stage]
        parts.append(f"{len(done)} trial(s) of this stage have finished, {len(ctx.pending)} still run")
        if ctx.memory_limit_gb:
            parts.append(f"the memory limit is {ctx.memory_limit_gb:.2f} GB")
        return (f"You asked: {question.strip()!r}. The rules agents cannot discuss it; here is what the proposal "
                "rests on: " + "; ".join(parts) + ".")

    def last_calls(self) -> list[AgentCallInfo]:
        """Calls made by the last ``propose`` (LLM strategies report tokens and fallbacks)."""
        return []


class Critic(abc.ABC):
    """Checks candidates and picks one, or sends the proposer back with reasons."""

    name: str = "base"

    @abc.abstractmethod
    def critique(self, ctx: AgentContext, candidates: list[Candidate]) -> CriticVerdict: ...

    def last_calls(self) -> list[AgentCallInfo]:
        return []


def verdict_picks(verdict: CriticVerdict) -> list[str]:
    """The candidate ids a verdict picked, best first."""
    if verdict.picks:
        return list(dict.fromkeys(verdict.picks))
    return [verdict.pick] if verdict.pick is not None else []
