"""Shared pieces of the LLM-agent tests: a toy search space, an agent context, tiny fallback strategies."""

from __future__ import annotations

from typing import Any

from mart.nodes.agents.base import AgentContext, Critic, CriticVerdict, Proposer
from mart.state.models import (
    Candidate,
    Critique,
    HealthEvent,
    PhaseProfile,
    Profile,
    TrialRecord,
    TrialStatus,
)
from mart.state.options import TuneOptions
from mart.state.search_space import Constraint, ParamSpec, SearchSpace

GMU = "rollout.gpu_memory_utilization"
SEQS = "rollout.max_num_seqs"
TP = "rollout.tensor_model_parallel_size"
DYN = "actor.use_dynamic_bsz"
LR = "actor.optim.lr"
N = "rollout.n"

SECRET = "sk-test-0123456789abcdefSECRET"


def _seqs_fit(config: dict[str, Any]) -> str | None:
    seqs, gmu = config.get(SEQS, 256), config.get(GMU, 0.5)
    if seqs > 2000 * gmu:
        return f"{SEQS} ({seqs}) must be <= 2000 x {GMU} ({gmu})."
    return None


SPACE = SearchSpace(
    backend="toy",
    params=[
        ParamSpec(GMU, "system", "float", 0.5, "Share of GPU memory vLLM may take.", low=0.2, high=0.95),
        ParamSpec(SEQS, "system", "int", 256, "vLLM's cap on concurrent sequences.", low=16, high=1024),
        ParamSpec(TP, "system", "categorical", 2, "Rollout tensor parallel degree.", choices=(1, 2, 4)),
        ParamSpec(DYN, "system", "bool", False, "Pack micro batches by token count."),
        ParamSpec(LR, "learning", "log", 1e-6, "Actor learning rate.", low=1e-8, high=1e-4),
        ParamSpec(N, "learning", "int", 4, "Samples per prompt.", low=2, high=16),
    ],
    constraints=[Constraint("seqs_fit_memory", "max_num_seqs <= 2000 x gpu_memory_utilization.", _seqs_fit)],
)

BASE = {**SPACE.defaults(), "trainer.n_gpus_per_node": 2}


def predict_memory(config: dict[str, Any]) -> float:
    """A toy memory model: 40 GB + 60 GB x gpu_memory_utilization, +5 GB with TP 1."""
    return 40.0 + 60.0 * float(config.get(GMU, 0.5)) + (5.0 if config.get(TP) == 1 else 0.0)


def history() -> list[TrialRecord]:
    return [
        TrialRecord(trial_id="t001", stage="system", kind="baseline", config=dict(BASE),
                    status=TrialStatus.COMPLETED, steps_done=6, throughput=1000.0, peak_memory_gb=70.0),
        TrialRecord(trial_id="t002", stage="system", candidate_id="sys-01-r0-c0", config={**BASE, GMU: 0.9},
                    status=TrialStatus.OOM, reason="peak 94.1 GB over the 90 GB capacity", steps_done=2,
                    peak_memory_gb=94.1),
        TrialRecord(trial_id="t003", stage="system", candidate_id="sys-02-r0-c1", config={**BASE, SEQS: 512},
                    status=TrialStatus.COMPLETED, steps_done=6, throughput=1150.0, peak_memory_gb=71.5),
    ]


def profile() -> Profile:
    return Profile(
        trial_id="t001", stage="system", throughput=1000.0, step_time_s=12.5,
        phases=[PhaseProfile(name="gen", mean_s=8.0, share=0.64), PhaseProfile(name="update_actor", mean_s=3.0, share=0.24),
                PhaseProfile(name="old_log_prob", mean_s=1.5, share=0.12)],
        bottleneck="gen", peak_memory_gb=70.0, memory_limit_gb=81.0, memory_headroom_gb=11.0,
        response_length_mean=310.0, response_length_max=512.0, response_clip_ratio=0.07,
    )


def make_ctx(**kw: Any) -> AgentContext:
    args: dict[str, Any] = {
        "stage": "system",
        "objective": "maximise throughput within the memory margin",
        "search_space": SPACE,
        "base_config": dict(BASE),
        "best_overrides": {SEQS: 512},
        "profile": profile(),
        "history": history(),
        "health_events": [HealthEvent(trial_id="t002", step=2, rule="memory_trend", severity="warn",
                                      message="memory rising", value=94.1)],
        "feedback": ["keep gpu_memory_utilization at or below 0.8: t002 ran out of memory"],
        "memory_limit_gb": 81.0,
        "predict_memory": predict_memory,
        "num_candidates": 3,
        "round": 1,
        "backend": "toy",
    }
    args.update(kw)
    return AgentContext(**args)


def options(base_url: str, **kw: Any) -> TuneOptions:
    args: dict[str, Any] = {"agents": "llm", "llm_model": "stub-model", "llm_base_url": base_url,
                            "llm_timeout_s": 5.0, "llm_price_per_mtok": (1.0, 4.0)}
    args.update(kw)
    return TuneOptions(**args)


class FallbackProposer(Proposer):
    """A minimal rules stand-in: one valid, untried candidate (TP 4 on top of the best)."""

    name = "rules"

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, ctx: AgentContext) -> list[Candidate]:
        self.calls += 1
        return [Candidate(candidate_id="", stage=ctx.stage, overrides={**ctx.best_overrides, TP: 4},
                          rationale="fallback: larger TP", source="rules")]


class FallbackCritic(Critic):
    """A minimal rules stand-in: accepts everything, picks the first."""

    name = "rules"

    def __init__(self) -> None:
        self.calls = 0

    def critique(self, ctx: AgentContext, candidates: list[Candidate]) -> CriticVerdict:
        self.calls += 1
        crits = [Critique(candidate_id=c.candidate_id, accepted=True, reasons=["fallback: ok"]) for c in candidates]
        return CriticVerdict(critiques=crits, pick=candidates[0].candidate_id if candidates else None)


def proposal(*candidates: dict[str, Any], analysis: str = "gen dominates the step") -> dict[str, Any]:
    """A ProposalSet answer from ``{key: value}`` dicts."""
    return {"analysis": analysis, "candidates": [
        {"overrides": [{"key": k, "value": v} for k, v in c.items()], "rationale": f"try {sorted(c)}",
         "expected_gain": 0.1} for c in candidates]}
