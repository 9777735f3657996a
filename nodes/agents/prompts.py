"""Prompts of the LLM proposer and critic: versioned constants, and builders that fill them with facts.

Everything an LLM agent is told comes from here, so a prompt change is a change to this file and to
``PROMPT_VERSION`` (recorded with each call). The builders only *render* what mart already knows: the
stage and its objective, the search space (``SearchSpace.describe``: the catalogue is the one source of
truth for knob meanings, ranges, defaults and constraints), the baseline's phase profile, the memory
limit and headroom, the trial history as a compact table, the reviewer's feedback and backend notes
(for verl, the perf guide's ordering of knobs).

The LLM answers through the schemas in ``mart.nodes.agents.schemas``; the output contract is restated in
prose here too, because ``json_mode`` servers see no schema.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from mart.nodes.agents.base import AgentContext
from mart.nodes.agents.rules import model_candidates
from mart.nodes.agents.schedule import RULES, severities, transition_score
from mart.nodes.agents.schemas import CandidateCheck
from mart.state.agents import agents_in_config
from mart.state.models import Candidate, HealthEvent, TrialRecord
from mart.state.stages import measures_throughput, memory_bound
from mart.state.units import fmt_gb

PROMPT_VERSION = "mart-agents/4"
"""Bump when a prompt's meaning changes; recorded with every LLM call."""

MAX_HISTORY_ROWS = 20
"""The history table keeps the baselines, the best trial and the latest rows up to this many."""

# --------------------------------------------------------------------------- proposer

PROPOSER_SYSTEM = """\
You are the proposer agent of mart, a tuner for the hyperparameters of LLM reinforcement-learning \
post-training (GRPO on verl). You propose configurations for the next trial; a critic agent and a human \
reviewer check them before anything runs.

Rules:
- Ground every proposal in the facts you are given (the phase profile, the memory headroom, the trial \
history, the reviewer's feedback). Do not invent measurements.
- Only change knobs listed in the search space of the current stage, to values inside their range or \
choices, and respect every constraint.
- Change few knobs per candidate (one to three), so that a result can be attributed. Make the candidates \
differ: each tests a different hypothesis.
- Never propose a configuration that is already in the trial history.
- If the reviewer gave feedback, follow it: it overrides your own preferences.
- The rationale is shown to the human reviewer: name the knob(s), the expected effect and the fact that \
motivates it, in one to three sentences."""

PROPOSER_TASK = """\
# Task
Stage: {stage}. Objective: {objective}
Propose exactly {k} candidate configurations (proposal round {round}).
Each candidate lists only the knobs it changes relative to the current best configuration below.

# Search space of the {stage} stage ({backend} backend)
{search_space}

# Current best configuration of this stage
{current_best}

# Phase profile
{profile}

# Trial history
{history}

# Reviewer feedback and earlier critiques
{feedback}
{notes}
# Answer
{output_contract}"""

PROPOSER_OUTPUT = """\
Answer with one JSON object, no prose around it:
{"analysis": "<what limits the objective now, from the facts above>",
 "candidates": [{"overrides": [{"key": "<knob key>", "value": <new value>}, ...],
                 "rationale": "<why, citing the facts>", "expected_gain": <relative gain, e.g. 0.1, or null>}, ...]}"""

PROPOSER_SCHEDULE = """\
Stage 3 (schedule) is different: training is cut into segments, and you are at a checkpoint. Every candidate \
is a *transition*: the learning knobs the next segment trains with, starting from the checkpoint's weights. \
Coordinated multi-knob transitions (one to four knobs) are welcome here; each candidate should answer a finding \
of the diagnosis (name it) or, on a healthy trajectory, add capacity. Known patterns, with their sources, are \
listed under "Transition patterns"; use them as evidence, not as a recipe."""

PROPOSER_SCHEDULE_TASK = """\
# Task
Stage: schedule. Objective: {objective}
Propose exactly {k} transitions for the segment {segment} (proposal round {round}).
Each candidate lists only the knobs it changes relative to the parent branch's configuration at the checkpoint.

# Diagnosis of the trajectory so far (JSON; null = not measured)
{diagnosis}

# Learning knobs ({backend} backend)
{search_space}

# Parent branch's configuration at the checkpoint (learning knobs)
{parent}

# Branches already run from this checkpoint (never repeat one)
{siblings}

# Transition patterns (public sources)
{patterns}

# Trial history
{history}

# Reviewer feedback and earlier critiques
{feedback}
{notes}
# Answer
{output_contract}"""

# --------------------------------------------------------------------------- critic

CRITIC_SYSTEM = """\
You are the critic agent of mart, a tuner for the hyperparameters of LLM reinforcement-learning \
post-training (GRPO on verl). You check the proposer's candidates before a human reviewer sees them, \
and pick the one to run next.

For every candidate decide accept or reject, with a reason a human reviewer can check, and a risk \
(low, medium, high) of out-of-memory, crash or regression. Judge from the facts given:
- mart's own checks: a candidate that fails validation or a constraint must be rejected.
- the memory model's prediction against the memory limit (predictions are estimates; say so when a \
candidate is close to the limit), and past out-of-memory or failed trials with similar settings.
- the trial history: reject near-repeats of configurations that did not help.
- the phase profile: prefer candidates that target the bottleneck phase.
- the reviewer's feedback.
Pick the accepted candidate most likely to improve the objective at acceptable risk. If none is worth \
running, set pick to null and say in feedback what the proposer should change."""

CRITIC_SCHEDULE = """\
Stage 3 (schedule): each candidate is a transition for the next training segment from a checkpoint. Prefer the \
transition that answers the most severe finding of the diagnosis (mart's own reading is given per candidate), \
reject one that repeats a branch already run from this checkpoint, and weigh the memory a longer response \
budget or more rollouts adds against the limit."""

CRITIC_TASK = """\
# Task
Stage: {stage}. Objective: {objective}
Memory limit (peak GB, (1 - margin) x capacity): {memory_limit}
Review these {n} candidates (proposal round {round}). Overrides are relative to the stage's base configuration.

{candidates}

# Phase profile
{profile}

# Trial history
{history}

# Reviewer feedback and earlier critiques
{feedback}
{notes}
# Answer
{output_contract}"""

CRITIC_OUTPUT = """\
Answer with one JSON object, no prose around it:
{"verdicts": [{"candidate_id": "<id as given>", "accept": true|false, "reason": "<checkable reason>",
               "risk": "low"|"medium"|"high"}, ... one per candidate],
 "pick": "<candidate_id of an accepted candidate>" or null,
 "feedback": "<if pick is null: what the proposer should change; else empty>"}"""

# --------------------------------------------------------------------------- repair

REPAIR = """\
Your answer could not be used (attempt {attempt} of {attempts}). mart's validation found:
{errors}

Answer again with the complete corrected JSON object (all {what}), following the same format. Use only \
knobs of the search space with values inside their ranges and satisfying the constraints."""

# --------------------------------------------------------------------------- backend notes

VERL_PERF_GUIDE = """\
verl's performance guide tunes system knobs in this order (docs/perf/perf_tuning.rst): (1) rollout memory \
share (gpu_memory_utilization) and vLLM's max_num_seqs / max_num_batched_tokens; (2) a smaller rollout \
tensor-parallel size; (3) remove padding; (4) larger micro batch sizes (forward-only log-prob passes take \
about 2x the training micro batch); (5) dynamic batch size with ppo_max_token_len_per_gpu >= 2-3 x \
(prompt + response length); (6) Ulysses sequence parallelism only beyond ~32k tokens; (7) FSDP2; (8) entropy \
chunking / checkpointing. Rule of thumb: GPU memory x gpu_memory_utilization x TP > 2 x the model's \
parameter bytes. Small models gain most from raising gpu_memory_utilization and lowering TP."""

BACKEND_NOTES: dict[tuple[str, str], str] = {
    ("verl", "system"): VERL_PERF_GUIDE,
    ("sim", "system"): VERL_PERF_GUIDE,
}
"""(backend, stage) -> facts added to the prompts unless the node already put them in ``ctx.notes``."""


# --------------------------------------------------------------------------- builders


def build_proposer_prompt(ctx: AgentContext) -> list[BaseMessage]:
    """System + user messages asking for ``ctx.num_candidates`` candidates of ``ctx.stage``."""
    if ctx.traits.branches:
        return _build_schedule_prompt(ctx)
    user = PROPOSER_TASK.format(
        stage=ctx.stage,
        objective=ctx.objective,
        k=ctx.num_candidates,
        round=ctx.round,
        backend=ctx.backend,
        search_space=format_search_space(ctx),
        current_best=format_current_best(ctx),
        profile=format_profile(ctx) + format_job_model(ctx),
        history=format_history(ctx) + format_multi_agent(ctx),
        feedback=format_feedback(ctx.feedback),
        notes=format_notes(ctx),
        output_contract=PROPOSER_OUTPUT,
    )
    return [SystemMessage(PROPOSER_SYSTEM), HumanMessage(user)]


def _build_schedule_prompt(ctx: AgentContext) -> list[BaseMessage]:
    user = PROPOSER_SCHEDULE_TASK.format(
        objective=ctx.objective,
        k=ctx.num_candidates,
        segment=format_segment(ctx),
        round=ctx.round,
        diagnosis=format_diagnosis(ctx),
        backend=ctx.backend,
        search_space=format_search_space(ctx),
        parent=format_parent(ctx),
        siblings=format_siblings(ctx),
        patterns=format_patterns(ctx),
        history=format_history(ctx),
        feedback=format_feedback(ctx.feedback),
        notes=format_notes(ctx),
        output_contract=PROPOSER_OUTPUT,
    )
    return [SystemMessage(PROPOSER_SYSTEM + "\n\n" + PROPOSER_SCHEDULE), HumanMessage(user)]


def build_critic_prompt(
    ctx: AgentContext, candidates: list[Candidate], checks: Mapping[str, CandidateCheck]
) -> list[BaseMessage]:
    """System + user messages asking for a verdict per candidate and a pick."""
    user = CRITIC_TASK.format(
        stage=ctx.stage,
        objective=ctx.objective,
        memory_limit=_gb(ctx.memory_limit_gb) if ctx.memory_limit_gb is not None else "none set",
        n=len(candidates),
        round=ctx.round,
        candidates=format_candidates(ctx, candidates, checks),
        profile=format_profile(ctx),
        history=format_history(ctx) + format_multi_agent(ctx),
        feedback=format_feedback(ctx.feedback),
        notes=format_notes(ctx),
        output_contract=CRITIC_OUTPUT,
    )
    if ctx.traits.branches:
        user = user.replace("\n# Phase profile\n", f"\n# Diagnosis at the checkpoint ({format_segment(ctx)})\n"
                            f"{format_diagnosis(ctx)}\n\n# Phase profile\n", 1)
        return [SystemMessage(CRITIC_SYSTEM + "\n\n" + CRITIC_SCHEDULE), HumanMessage(user)]
    return [SystemMessage(CRITIC_SYSTEM), HumanMessage(user)]


def build_repair_message(errors: Iterable[str], *, attempt: int, attempts: int, role: str) -> HumanMessage:
    """The follow-up turn quoting mart's validation errors."""
    what = "candidates" if role == "proposer" else "verdicts and the pick"
    lines = "\n".join(f"- {e}" for e in errors) or "- (no details)"
    return HumanMessage(REPAIR.format(attempt=attempt, attempts=attempts, errors=lines, what=what))


# --------------------------------------------------------------------------- sections


def format_search_space(ctx: AgentContext) -> str:
    return ctx.search_space.describe(ctx.stage) or "(no knobs)"  # type: ignore[arg-type]


def format_segment(ctx: AgentContext) -> str:
    if ctx.segment is None:
        return "(not given)"
    frm, to = ctx.segment
    return f"steps {frm}-{to} (from the checkpoint at step {frm}, {to - frm} steps)"


def format_diagnosis(ctx: AgentContext) -> str:
    """The diagnosis as JSON (measured values, findings, severities), or a line saying there is none."""
    if ctx.diagnosis is None:
        return "No diagnosis (no metrics before this checkpoint)."
    data = ctx.diagnosis.model_dump(mode="json")
    data["severity"] = severities(ctx)
    data["severity"].pop("healthy", None)
    return json.dumps(data, indent=1, default=str)


def format_parent(ctx: AgentContext) -> str:
    config = ctx.base_config
    keys = [p.key for p in ctx.search_space.stage_params(ctx.stage)]  # type: ignore[arg-type]
    return _compact({k: config[k] for k in keys if k in config}) or "(the backend's defaults)"


def format_siblings(ctx: AgentContext) -> str:
    frm = ctx.segment[0] if ctx.segment else None
    rows = [t for t in ctx.history if t.stage == ctx.stage
            and (frm is None or t.parent_step == frm or (not frm and t.parent_step is None))]
    if not rows and not ctx.rejected:
        return "None yet."
    parent = ctx.base_config
    lines = []
    for t in rows:
        diff = {k: v for k, v in t.config.items() if parent.get(k, _MISSING) != v}
        lines.append(f"- {t.trial_id}: {_compact(diff) if diff else '(unchanged)'} -> {t.status.value}, "
                     f"score {_num(t.score)}")
    for o in ctx.rejected:
        lines.append(f"- rejected by the reviewer: {_compact(o)}")
    return "\n".join(lines)


def format_patterns(ctx: AgentContext) -> str:
    """The rules proposer's transition patterns, one line each, with the findings they answer."""
    return "\n".join(f"- {r.name} (answers {', '.join(r.answers)}): {r.why}" for r in RULES)


def format_current_best(ctx: AgentContext) -> str:
    if not ctx.best_overrides:
        return "The baseline (the base configuration, no overrides yet)."
    return "The baseline plus these overrides: " + _compact(ctx.best_overrides)


def format_profile(ctx: AgentContext) -> str:
    """Throughput, phases with their time share, the bottleneck, memory and headroom, response lengths."""
    p = ctx.profile
    limit = ctx.memory_limit_gb if ctx.memory_limit_gb is not None else (p.memory_limit_gb if p else None)
    if p is None:
        return "No profile yet." + (f" Memory limit: {_gb(limit)}." if limit is not None else "")
    lines = [f"Measured on trial {p.trial_id} ({p.stage} stage)."]
    lines.append(f"- throughput: {p.throughput:.4g} tokens/s; step time: {p.step_time_s:.3g} s")
    if p.phases:
        phases = sorted(p.phases, key=lambda ph: -ph.share)
        lines.append("- phases (share of step time, mean seconds): "
                     + ", ".join(f"{ph.name} {ph.share:.0%} ({ph.mean_s:.3g} s)" for ph in phases))
    lines.append(f"- bottleneck: {p.bottleneck}")
    headroom = p.memory_headroom_gb
    if headroom is None and limit is not None:
        headroom = limit - p.peak_memory_gb
    mem = f"- peak memory: {_gb(p.peak_memory_gb)}"
    if limit is not None:
        mem += f"; memory limit: {_gb(limit)}; headroom to the limit: {_gb(headroom)}"
    lines.append(mem)
    lines.append(f"- response length: mean {p.response_length_mean:.4g}, max {p.response_length_max:.4g} tokens; "
                 f"clip ratio {p.response_clip_ratio:.2f} (share of responses truncated at max_response_length)")
    if p.score is not None:
        lines.append(f"- validation score: {p.score:.4g}")
    if p.entropy is not None:
        lines.append(f"- policy entropy: {p.entropy:.4g}")
    return "\n".join(lines)


def format_history(ctx: AgentContext, max_rows: int = MAX_HISTORY_ROWS) -> str:
    """A compact table: config diff vs the stage's baseline, outcome, memory, health events."""
    stage_trials = [t for t in ctx.history if t.stage == ctx.stage]
    earlier = _earlier_stages(ctx)
    if not stage_trials:
        return "No trials yet in this stage." + (f"\n{earlier}" if earlier else "")
    baselines = {t.stage: t for t in ctx.history if t.kind == "baseline"}
    events: dict[str, list[HealthEvent]] = {}
    for e in ctx.health_events:
        events.setdefault(e.trial_id, []).append(e)
    best = _best_trial(stage_trials, ctx.stage, ctx.memory_limit_gb)
    rows = _select_rows(stage_trials, best, max_rows)
    out = ["| trial | stage | kind | changes vs stage baseline | status | throughput tok/s | score | peak GB | health |",
           "|---|---|---|---|---|---|---|---|---|"]
    for t in rows:
        base = baselines.get(t.stage)
        ref = base.config if base is not None and base is not t else (ctx.base_config if t.kind != "baseline" else t.config)
        diff = {k: v for k, v in t.config.items() if ref.get(k, _MISSING) != v}
        status = t.status.value + (" (early stop)" if t.early_stopped else "")
        if t.reason and t.status.value != "completed":
            status += f": {_clip(t.reason, 80)}"
        out.append("| " + " | ".join([
            t.trial_id + (" (best)" if best is not None and t is best else ""),
            t.stage,
            t.kind,
            _compact(diff) if diff else "-",
            status,
            _num(t.throughput),
            _num(t.score),
            _num(t.peak_memory_gb),
            _events(events.get(t.trial_id, [])),
        ]) + " |")
    if len(rows) < len(stage_trials):
        out.append(f"({len(stage_trials) - len(rows)} older trials not shown)")
    if earlier:
        out.append(earlier)
    return "\n".join(out)


def _earlier_stages(ctx: AgentContext) -> str:
    """One line per other stage: how many trials, and the best one (its config is fixed in the base)."""
    lines = []
    for stage in ("system", "learning"):
        trials = [t for t in ctx.history if t.stage == stage]
        if stage == ctx.stage or not trials:
            continue
        best = _best_trial(trials, stage, ctx.memory_limit_gb)
        what = "throughput" if measures_throughput(stage) else "score"
        line = f"{stage} stage: {len(trials)} trials"
        if best is not None:
            line += f"; best {best.trial_id} with {what} {_num(best.objective(stage))} (its config is in the base)"
        lines.append(line)
    return "\n".join(lines)


def format_job_model(ctx: AgentContext, top: int = 3) -> str:
    """The job model as the LLM's tool: its predictions for the best configs it found, its track record,
    and how candidates are scored. Empty without a model (a backend that cannot describe its job)."""
    model = ctx.job_model
    if model is None or ctx.traits.objective != "throughput":
        return ""

    lines = ["", "# Job model (mart's calibrated per-phase model; every candidate is scored by it)"]
    inc = ctx.predict(ctx.full_config(ctx.best_overrides))
    if inc is not None:
        lines.append(f"- current best predicted: {inc.throughput:.0f} tok/s/GPU, peak {fmt_gb(inc.peak_gb)}; "
                     f"confidence {inc.confidence:.2f}; safety gap under the limit {fmt_gb(inc.gap_gb)}")
        lines.append("- predicted seconds per phase: " + ", ".join(f"{k} {v:.1f}" for k, v in inc.phase_s.items()))
        lines.append("- predicted GB per phase: " + ", ".join(f"{k} {v:.1f}" for k, v in inc.phase_gb.items() if v > 0))
    try:
        best = model_candidates(ctx, source="model", n=top)
    except Exception:  # noqa: BLE001 - the prompt must not fail because the search did
        best = []
    for c in best:
        lines.append(f"- model's pick: {_compact(c.overrides)} -> predicted {c.predicted_throughput or 0:.0f} tok/s/GPU "
                     f"({(c.expected_gain or 0):+.1%}), peak {fmt_gb(c.predicted_memory_gb or 0)}")
    recent = [p for p in ctx.predictions if p.get("predicted_throughput")][-4:]
    for p in recent:
        lines.append(f"- track record {p['trial_id']}: predicted {p['predicted_throughput']:.0f} tok/s, "
                     f"measured {p.get('throughput') or 0:.0f}; peak predicted {fmt_gb(p.get('predicted_peak_gb') or 0)}, "
                     f"measured {fmt_gb(p.get('peak_memory_gb') or 0)} ({p.get('status')})")
    lines.append("- Use it: propose what the model misses (interactions, knobs it does not model, the reviewer's "
                 "wishes) or sharpen its picks; a candidate it predicts over the limit is sent back to you.")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- multi-agent jobs

MULTI_AGENT_GUIDE = """\
How to answer multi-agent findings (each agent has its own policy and optimizer; knobs `agents.<i>.<knob>` \
belong to agent i, the others are shared):
- one agent unstable or collapsed while the others are healthy: change that agent's own knobs (lower its \
learning rate, raise its KL penalty or entropy bonus), not the shared ones or the healthy agents';
- the reward concentrating on one agent (the others learn from almost nothing): re-shape the reward \
(a larger reward.shaping_alpha, the other reward.shaping_mode or reward.history_scope);
- an agent copying the others' answers: more diversity for that agent (its temperature or entropy bonus);
- debate rounds that change no answer: fewer workflow.num_rounds cost less generation for the same answers."""

MAX_AGENT_FINDINGS = 12
"""The multi-agent section lists at most this many findings, the newest first."""


def format_multi_agent(ctx: AgentContext) -> str:
    """The agents of a multi-agent job, this stage's per-agent findings and pathologies, and how to answer
    them; empty for a single-agent job."""
    stage_trials = {t.trial_id for t in ctx.history if t.stage == ctx.stage}
    events = [e for e in ctx.health_events if e.trial_id in stage_trials
              and (e.agent is not None or e.rule == "stale_debate_rounds")]
    agents = sorted(set(agents_in_config(p.key for p in ctx.search_space.params))
                    | {e.agent for e in events if e.agent is not None})
    if not agents and not events:
        return ""
    lines = ["", "", f"# Multi-agent job (agents {', '.join(map(str, agents)) or 'unknown'})"]
    pathology = {"agent_copying", "reward_concentration", "stale_debate_rounds"}
    shown = sorted(events, key=lambda e: -e.step)[:MAX_AGENT_FINDINGS]
    for title, group in (("Per-agent health findings", [e for e in shown if e.rule not in pathology]),
                         ("Multi-agent pathologies", [e for e in shown if e.rule in pathology])):
        lines.append(f"{title} in this stage:")
        lines += [f"- {e.trial_id} step {e.step}: {e.scoped_rule} ({e.severity}): {_clip(e.message, 160)}"
                  for e in group] or ["- none"]
    if len(events) > len(shown):
        lines.append(f"({len(events) - len(shown)} older findings not shown)")
    lines.append(MULTI_AGENT_GUIDE)
    return "\n".join(lines)


def format_feedback(feedback: list[str]) -> str:
    if not feedback:
        return "None."
    return "\n".join(f"- {f}" for f in feedback) + "\n(The latest is last; address it first.)"


def format_notes(ctx: AgentContext) -> str:
    notes = list(ctx.notes)
    extra = BACKEND_NOTES.get((ctx.backend, ctx.stage))
    if extra and not any("perf" in n.lower() and "guide" in n.lower() for n in notes):
        notes.append(extra)
    if not notes:
        return ""
    return "\n# Backend notes\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def format_candidates(ctx: AgentContext, candidates: list[Candidate], checks: Mapping[str, CandidateCheck]) -> str:
    blocks = []
    for c in candidates:
        chk = checks.get(c.candidate_id) or CandidateCheck()
        lines = [f"### Candidate `{c.candidate_id}` (source: {c.source})",
                 f"overrides: {_compact(c.overrides) if c.overrides else '(none: the base configuration)'}",
                 f"rationale: {c.rationale or '(none given)'}"]
        if c.expected_gain is not None:
            lines.append(f"proposer's expected gain: {c.expected_gain:+.1%}")
        if chk.predicted_memory_gb is None:
            lines.append("predicted peak memory: unknown (no memory model yet)")
        elif ctx.memory_limit_gb is not None:
            margin = ctx.memory_limit_gb - chk.predicted_memory_gb
            side = "under" if margin >= 0 else "OVER"
            lines.append(f"predicted peak memory: {_gb(chk.predicted_memory_gb)} ({_gb(abs(margin))} {side} the limit)")
        else:
            lines.append(f"predicted peak memory: {_gb(chk.predicted_memory_gb)}")
        lines.extend(_model_line(ctx, c))
        if ctx.traits.branches:
            score, answers = transition_score(ctx, c.overrides)
            lines.append(f"answers (mart's reading): {answers or 'no finding of the diagnosis'}; severity score {score:.2f}")
        lines.append("validation: " + ("ok" if not chk.validation_errors else "FAILED: " + " ".join(chk.validation_errors)))
        lines.append("constraints: " + ("ok" if not chk.constraint_errors else "FAILED: " + " ".join(chk.constraint_errors)))
        lines.append("already tried: " + ("yes, identical to a past trial" if chk.duplicate else "no"))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _model_line(ctx: AgentContext, c: Candidate) -> list[str]:
    """The job model's view of a candidate for the critic: predicted gain over the current best and the
    chance its peak crosses the limit (rank by both)."""
    if ctx.job_model is None or ctx.traits.objective != "throughput":
        return []
    pred = ctx.predict(ctx.full_config(c.overrides))
    inc = ctx.predict(ctx.full_config(ctx.best_overrides))
    if pred is None or inc is None:
        return []
    line = (f"job model: predicted {pred.throughput / max(inc.throughput, 1e-9) - 1:+.1%} tok/s over the current best "
            f"({pred.throughput:.0f} tok/s/GPU), peak {fmt_gb(pred.peak_gb)}")
    if ctx.memory_limit_gb:
        sigma = max(pred.gap_gb / 2, 1e-6)
        p_over = 0.5 * math.erfc((ctx.memory_limit_gb - pred.peak_gb) / (sigma * math.sqrt(2)))
        line += f", P(over the limit) {p_over:.0%}"
    return [line + f"; model confidence {pred.confidence:.2f}"]


# --------------------------------------------------------------------------- helpers

_MISSING = object()


def _gb(v: float | None) -> str:
    return "unknown" if v is None else f"{fmt_gb(v)}"


def _num(v: float | None) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.4g}"


def _clip(s: str, n: int) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _compact(d: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in d.items())


def _events(evs: list[HealthEvent]) -> str:
    if not evs:
        return "-"
    shown = [f"{e.scoped_rule}@{e.step}({e.severity})" for e in evs[:3]]
    if len(evs) > 3:
        shown.append(f"+{len(evs) - 3}")
    return ", ".join(shown)


def _best_trial(history: list[TrialRecord], stage: str, limit_gb: float | None) -> TrialRecord | None:
    def feasible(t: TrialRecord) -> bool:
        if t.stage != stage or t.status.value != "completed" or t.objective(stage) is None:
            return False
        return not memory_bound(stage) or limit_gb is None or t.peak_memory_gb is None or t.peak_memory_gb <= limit_gb

    done = [t for t in history if feasible(t)]
    return max(done, key=lambda t: t.objective(stage)) if done else None  # type: ignore[arg-type, return-value]


def _select_rows(history: list[TrialRecord], best: TrialRecord | None, max_rows: int) -> list[TrialRecord]:
    if len(history) <= max_rows:
        return list(history)
    keep = {id(t) for t in history if t.kind == "baseline"}
    if best is not None:
        keep.add(id(best))
    for t in reversed(history):
        if len(keep) >= max_rows:
            break
        keep.add(id(t))
    return [t for t in history if id(t) in keep]
