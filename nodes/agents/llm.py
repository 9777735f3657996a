"""LLM proposer and critic behind any OpenAI-compatible endpoint, with guard rails.

Guard rails (the same for both roles):
1. Every answer is checked: its JSON shape (``mart.nodes.agents.schemas``), every override against the search
   space (``SearchSpace.validate_overrides``) and the full config against the constraints
   (``check_constraints``); the proposer also refuses repeats of tried configs.
2. An unusable answer gets up to ``repair_rounds`` follow-up turns quoting mart's errors.
3. If it is still unusable, or the endpoint fails (timeout; 429/5xx after the client's bounded retries),
   the rules strategy answers this round, and the reason is recorded (``AgentCallInfo.fallback_reason``
   on a ``strategy="rules"`` row, which the nodes write to the ledger's ``agent_calls`` table).
4. After ``MAX_CONSECUTIVE_FAILURES`` endpoint failures in a row (or one auth/unknown-model error), or
   ``MAX_INVALID_ROUNDS`` rounds in a row without a usable answer, the strategy stops calling the endpoint
   for the rest of the session and says so in every fallback reason.
5. A repair turn quotes at most ``MAX_QUOTED_ANSWER`` characters of the bad answer (a huge answer is never
   sent back); the ledger keeps the bad answer cut to ``MAX_RAW_ANSWER`` characters, with its attempt number.

Every LLM call yields one ``AgentCallInfo`` with its tokens, cost (when a price is configured) and latency.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from mart.nodes.agents.base import AgentCallInfo, AgentContext, Critic, CriticVerdict, Proposer
from mart.nodes.agents.llm_client import LLMCallError, LLMReply, LLMSettings, StructuredChat, resolve_api_key
from mart.nodes.agents.prompts import (
    PROMPT_VERSION,
    build_critic_prompt,
    build_proposer_prompt,
    build_repair_message,
)
from mart.nodes.agents.rules import HEDGES, RulesCritic, RulesProposer, model_candidates
from mart.nodes.agents.schemas import CandidateCheck, ProposalSet, VerdictSet, validation_messages
from mart.state.models import Candidate, Critique, config_hash
from mart.state.search_space import ConfigError
from mart.state.units import fmt_gb

if TYPE_CHECKING:
    from mart.state.options import TuneOptions

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 3
MAX_INVALID_ROUNDS = 3
MAX_QUOTED_ANSWER = 4000
MAX_RAW_ANSWER = 4000
MAX_TEXT = 1200
"""Longest rationale / reason kept from an LLM answer (they travel in graph state and the ledger)."""
GAIN_RANGE = (-1.0, 3.0)
"""An expected gain outside this range (e.g. 50 meaning +50%) is clamped; non-finite ones are dropped."""
_RISK_WEIGHT = {"low": 1.0, "medium": 0.6, "high": 0.3}


class _LLMStrategy:
    """What the proposer and critic share: settings, the chat client, call records, the failure breaker."""

    role = "agent"
    schema: Any = None

    def __init__(self, options: TuneOptions, *, api_key: str | None, **overrides: Any) -> None:
        self.settings = LLMSettings.resolve(options, **overrides)
        key = resolve_api_key(api_key, self.settings.base_url)
        self.chat = StructuredChat(self.settings, key, self.schema)
        self.prompt_version = PROMPT_VERSION
        self._calls: list[AgentCallInfo] = []
        self._failures = 0
        self._invalid_rounds = 0
        self._disabled: str | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.settings.model!r}, base_url={self.settings.base_url!r})"

    def last_calls(self) -> list[AgentCallInfo]:
        return list(self._calls)

    # one round of calls: first prompt, then repairs -------------------------------------------------
    def _converse(self, messages: list[Any], check: Any) -> tuple[Any, str | None]:
        """Ask, check, repair. Returns (usable result, None) or (best partial result or None, failure reason).

        ``check(reply) -> (result, errors)``: ``result`` may be usable even with errors (partial answers);
        an empty ``errors`` ends the conversation.
        """
        if self._disabled:
            return None, self._disabled
        attempts = 1 + self.settings.repair_rounds
        result: Any = None
        errors: list[str] = []
        for attempt in range(1, attempts + 1):
            try:
                reply = self.chat.invoke(messages)
            except LLMCallError as e:
                self._record(None, ok=False, error=str(e), latency_s=e.latency_s, attempt=attempt)
                self._failures += 1
                if e.fatal or self._failures >= MAX_CONSECUTIVE_FAILURES:
                    self._disabled = (f"LLM endpoint disabled for this session after {self._failures} failed "
                                      f"call(s) in a row (last: {e})")
                return result, f"LLM endpoint failed: {e}"
            self._failures = 0
            new_result, errors = check(reply)
            if new_result is not None:
                result = new_result
            self._record(reply, ok=not errors, error="; ".join(errors) if errors else None, attempt=attempt)
            if not errors:
                self._invalid_rounds = 0
                return result, None
            if attempt < attempts:
                messages = [*messages, _assistant_turn(reply), build_repair_message(
                    errors, attempt=attempt, attempts=attempts, role=self.role)]
        rounds = self.settings.repair_rounds
        reason = (f"LLM answer still invalid after {rounds} repair round{'s' if rounds != 1 else ''}: "
                  + "; ".join(errors))
        if result is None:
            self._invalid_rounds += 1
            if self._invalid_rounds >= MAX_INVALID_ROUNDS:
                self._disabled = (f"LLM disabled for this session: no usable answer in {self._invalid_rounds} "
                                  f"rounds in a row (last: {_clip(reason, 300)})")
        else:
            self._invalid_rounds = 0  # a partial answer is usable
        return result, reason

    def _record(self, reply: LLMReply | None, *, ok: bool, error: str | None = None,
                strategy: str = "llm", fallback_reason: str | None = None, latency_s: float = 0.0,
                attempt: int | None = None) -> None:
        pt = reply.prompt_tokens if reply else 0
        ct = reply.completion_tokens if reply else 0
        self._calls.append(AgentCallInfo(
            role=self.role,
            strategy=strategy,
            ok=ok,
            fallback_reason=fallback_reason,
            error=error,
            prompt_tokens=pt,
            completion_tokens=ct,
            cost_usd=self.settings.cost_usd(pt, ct) if strategy == "llm" else None,
            latency_s=round(reply.latency_s if reply else latency_s, 4),
            model=self.settings.model if strategy == "llm" else None,
            prompt_version=self.prompt_version if strategy == "llm" else None,
            attempt=attempt,
            raw_answer=None if ok or reply is None else _clip(reply.text, MAX_RAW_ANSWER),
        ))
        if error:
            log.info("%s LLM call not usable: %s", self.role, error)

    def _record_fallback(self, name: str, reason: str) -> None:
        log.warning("%s: the %s strategy takes over this round: %s", self.role, name, reason)
        self._calls.append(AgentCallInfo(role=self.role, strategy=name, ok=True, fallback_reason=reason))


def _assistant_turn(reply: LLMReply) -> Any:
    from langchain_core.messages import AIMessage  # noqa: PLC0415 - the llm extra, imported when used

    text = reply.text or "(empty answer)"
    if len(text) > MAX_QUOTED_ANSWER:  # quote the head only: a huge answer must not grow every request
        text = text[:MAX_QUOTED_ANSWER] + f"\n[... answer cut by mart: {len(reply.text)} characters in all]"
    return AIMessage(content=text)


def _safe_predict(ctx: AgentContext, config: dict[str, Any]) -> float | None:
    try:
        value = ctx.predict_memory(config)
    except Exception as e:  # noqa: BLE001 - a memory model failure must not cost the round
        log.warning("memory model failed: %s", e)
        return None
    return None if value is None else float(value)


# --------------------------------------------------------------------------- proposer


class LLMProposer(_LLMStrategy, Proposer):
    """Proposes candidates with an LLM; the rules proposer takes over when the LLM cannot.

    Args:
        options: the session's options (model, base URL, timeout, price).
        api_key: from a CLI flag (memory only); else ``$OPENAI_API_KEY``.
        fallback: the strategy that answers when the LLM fails (the rules proposer).
        structured, max_retries, repair_rounds, streaming: see ``mart.nodes.agents.llm_client``.

    Raises:
        LLMConfigError: no model or no API key configured.
    """

    name = "llm"
    role = "proposer"
    schema = ProposalSet

    def __init__(self, options: TuneOptions, api_key: str | None = None, fallback: Proposer | None = None,
                 **overrides: Any) -> None:
        super().__init__(options, api_key=api_key, **overrides)
        if fallback is None:
            fallback = RulesProposer()
        self.fallback = fallback

    def propose(self, ctx: AgentContext) -> list[Candidate]:
        self._calls = []
        messages = build_proposer_prompt(ctx)
        found: dict[str, Candidate] = {}

        def check(reply: LLMReply) -> tuple[Any, list[str]]:
            if reply.data is None:
                return None, [reply.parse_error or "no answer"]
            try:
                answer = ProposalSet.model_validate(reply.data)
            except ValidationError as e:
                return None, validation_messages(e)
            errors = self._collect(ctx, answer, found)
            if not answer.candidates:
                errors.append(f"the answer has no candidates; propose exactly {ctx.num_candidates}")
            return (list(found.values()) or None), errors

        result, reason = self._converse(messages, check)
        if result:
            if reason:  # a partial answer: the valid candidates stand, the rest is on record
                log.info("proposer: using %d valid LLM candidate(s); %s", len(result), reason)
            return self._with_model_pick(ctx, result[: ctx.num_candidates])
        return self._fall_back(ctx, reason or "LLM gave no usable candidate")

    @staticmethod
    def _with_model_pick(ctx: AgentContext, candidates: list[Candidate]) -> list[Candidate]:
        """Stage 1 with a job model: the model's own best pick competes with the LLM's candidates (the critic
        ranks all by the same model), so the LLM steers part of the search and its share is on record
        (``trials_by_source`` in the summary). For a batch the model offers its hedges too, as it does to the
        rules proposer: the critic spends at most one slot on one (``RulesCritic._hedged_batch``)."""
        if ctx.traits.objective != "throughput" or ctx.job_model is None or not ctx.memory_limit_gb:
            return candidates

        keys = {c.key() for c in candidates}
        try:
            extra = [c for c in model_candidates(ctx, source="model", n=1, hedges=HEDGES if ctx.slots > 1 else 0)
                     if c.key() not in keys]
        except Exception as e:  # noqa: BLE001 - the LLM's candidates stand on their own
            log.warning("job model search failed: %s", e)
            extra = []
        return candidates + [c.model_copy(update={"candidate_id": f"model-sys-{c.key()[:8]}"}) for c in extra]

    def _collect(self, ctx: AgentContext, answer: ProposalSet, found: dict[str, Candidate]) -> list[str]:
        """Validate each proposed candidate; add the good ones to ``found`` (keyed by config hash)."""
        start = ctx.policy.proposal_start(ctx)  # stage 3: a transition changes its parent branch's config
        base_key = config_hash(ctx.full_config(start))
        tried = ctx.tried_keys()
        errors: list[str] = []
        for i, proposed in enumerate(answer.candidates[: ctx.num_candidates + 2], start=1):
            checked = _changes(ctx, i, proposed)
            if isinstance(checked, str):
                errors.append(checked)
                continue
            overrides = {**start, **checked}
            key = config_hash(ctx.full_config(overrides))
            error = _refusal(ctx, i, checked, overrides, key, base_key, tried)
            if error:
                errors.append(error)
                continue
            if key in found:
                continue  # the same candidate again (e.g. repeated in a repair answer): keep one
            made = _candidate(ctx, i, proposed, checked, overrides, key)
            if isinstance(made, str):
                errors.append(made)
            else:
                found[key] = made
        return errors

    def _fall_back(self, ctx: AgentContext, reason: str) -> list[Candidate]:
        name = getattr(self.fallback, "name", "rules")
        candidates = self.fallback.propose(ctx)
        self._calls.extend(self.fallback.last_calls())
        self._record_fallback(name, reason)
        note = f" [{name} proposer: {reason}]"
        return [c.model_copy(update={"rationale": (c.rationale + note).strip()}) for c in candidates]


def _changes(ctx: AgentContext, i: int, proposed: Any) -> dict[str, Any] | str:
    """The proposed candidate's changes, checked against the stage's knobs and with what they imply (a longer
    response limit's token caps), or why it is refused."""
    keys = [kv.key for kv in proposed.overrides]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        return f"candidate {i}: knob(s) {dupes} set more than once"
    try:
        changes = ctx.search_space.validate_overrides(proposed.overrides_dict(), stage=ctx.stage)
    except ConfigError as e:
        return f"candidate {i}: {e}"
    changes, _ = ctx.policy.implied(ctx, changes)  # caps move only with the limit they follow
    refused = ctx.policy.stage_refusals(ctx, changes)
    return f"candidate {i}: " + " ".join(refused) if refused else changes


def _refusal(ctx: AgentContext, i: int, changes: dict[str, Any], overrides: dict[str, Any], key: str,
             base_key: str, tried: set[str]) -> str | None:
    """Why the candidate may not run: the backend's constraints, no change, a config already tried."""
    broken = ctx.config_errors(overrides)
    if broken:
        return f"candidate {i} ({_kv(changes)}) breaks constraints: " + " ".join(broken)
    if key == base_key or not changes:
        return f"candidate {i}: changes nothing relative to the {ctx.policy.start_words}"
    if key in tried:
        return f"candidate {i} ({_kv(changes)}): this configuration was already tried{ctx.policy.tried_scope}"
    return None


def _candidate(ctx: AgentContext, i: int, proposed: Any, changes: dict[str, Any], overrides: dict[str, Any],
               key: str) -> Candidate | str:
    """The candidate with what the models predict of it, or why the memory rule refuses it."""
    full = ctx.full_config(overrides)
    limit = ctx.memory_limit_gb
    pred = ctx.predict(full) if ctx.traits.objective == "throughput" else None
    if pred is not None and limit and pred.peak_gb > limit:
        return (f"candidate {i} ({_kv(changes)}): the job model predicts a peak of {fmt_gb(pred.peak_gb)}, over the "
                f"limit {fmt_gb(limit)} (per phase: "
                + ", ".join(f"{p} {v:.1f}" for p, v in pred.phase_gb.items() if v > 0) + ")")
    peak = _safe_predict(ctx, full)
    if ctx.traits.branches and peak is not None and limit and peak > limit:
        parent = _safe_predict(ctx, dict(ctx.base_config))
        if parent is None or peak > parent:  # memory the transition adds (a longer budget, more rollouts)
            return (f"candidate {i} ({_kv(changes)}): the memory model predicts a peak of {fmt_gb(peak)}, "
                    f"over the limit {fmt_gb(limit)}")
    inc = ctx.predict(ctx.full_config(ctx.best_overrides)) if pred is not None else None
    return Candidate(
        candidate_id=f"llm-{ctx.stage[:3]}-{key[:8]}",
        stage=ctx.stage,
        overrides=overrides,
        rationale=_clip(proposed.rationale, MAX_TEXT) or "(the LLM gave no rationale)",
        source="llm",
        predicted_memory_gb=peak,
        predicted_throughput=None if pred is None else round(pred.throughput, 3),
        expected_gain=(round(pred.throughput / max(inc.throughput, 1e-9) - 1, 4) if pred is not None and inc
                       else _gain(proposed.expected_gain)),
    )


# --------------------------------------------------------------------------- critic


class LLMCritic(_LLMStrategy, Critic):
    """Critiques candidates with an LLM, given mart's own checks; the rules critic takes over when it cannot.

    The LLM sees each candidate's validation and constraint results, the memory model's prediction and the
    memory limit. Its verdicts are checked: one per candidate, known ids only, and a pick that is one of
    the accepted candidates. An accepted candidate that fails mart's checks is rejected with the reason;
    a pick of such a candidate moves to the next accepted, valid one (or to none).
    """

    name = "llm"
    role = "critic"
    schema = VerdictSet

    def __init__(self, options: TuneOptions, api_key: str | None = None, fallback: Critic | None = None,
                 **overrides: Any) -> None:
        super().__init__(options, api_key=api_key, **overrides)
        if fallback is None:
            fallback = RulesCritic()
        self.fallback = fallback

    def critique(self, ctx: AgentContext, candidates: list[Candidate]) -> CriticVerdict:
        self._calls = []
        if not candidates:
            return CriticVerdict(critiques=[], pick=None, feedback="no candidates to review")
        checks = {c.candidate_id: check_candidate(ctx, c) for c in candidates}
        messages = build_critic_prompt(ctx, candidates, checks)
        ids = [c.candidate_id for c in candidates]

        def check(reply: LLMReply) -> tuple[Any, list[str]]:
            if reply.data is None:
                return None, [reply.parse_error or "no answer"]
            try:
                answer = VerdictSet.model_validate(reply.data)
            except ValidationError as e:
                return None, validation_messages(e)
            errors = _verdict_errors(answer, ids)
            return (answer if not errors else None), errors

        answer, reason = self._converse(messages, check)
        if answer is None:
            return self._fall_back(ctx, candidates, reason or "LLM gave no usable verdict")
        return self._to_verdict(answer, candidates, checks, ctx.memory_limit_gb)

    def _to_verdict(self, answer: VerdictSet, candidates: list[Candidate],
                    checks: dict[str, CandidateCheck], limit_gb: float | None) -> CriticVerdict:
        by_id = {v.candidate_id: v for v in answer.verdicts}
        critiques: list[Critique] = []
        for c in candidates:
            v, chk = by_id[c.candidate_id], checks[c.candidate_id]
            reasons = [_clip(v.reason, MAX_TEXT) or "(no reason given)"]
            accepted, risk = v.accept, v.risk
            if accepted and not usable(chk):
                accepted, risk = False, "high"
                reasons.append("overridden by mart: " + _check_summary(chk))
            over = _over_limit(chk, limit_gb)
            if accepted and over:
                risk = "high"
                reasons.append(f"mart: {over}")
            critiques.append(Critique(
                candidate_id=c.candidate_id,
                accepted=accepted,
                reasons=reasons,
                predicted_memory_gb=chk.predicted_memory_gb,
                risk=risk,
                score=_RISK_WEIGHT[risk] if accepted else 0.0,
            ))
        accepted_ids = [cr.candidate_id for cr in critiques if cr.accepted]
        pick, feedback = answer.pick, _clip(answer.feedback, MAX_TEXT)
        if pick is not None and pick not in accepted_ids:
            why = _check_summary(checks[pick]) if not usable(checks[pick]) else "the critic did not accept it"
            new_pick = max(accepted_ids, key=lambda i: next(cr.score for cr in critiques if cr.candidate_id == i),
                           default=None)
            note = f"pick {pick} overridden by mart ({why})" + (f"; picked {new_pick} instead" if new_pick else "")
            for cr in critiques:
                if cr.candidate_id in (pick, new_pick):
                    cr.reasons.append(note)
            pick = new_pick
        for cr in critiques:
            if cr.candidate_id == pick:
                cr.score += 1.0
        if pick is None and not feedback:
            feedback = "; ".join(f"{cr.candidate_id}: {cr.reasons[0]}" for cr in critiques)
        return CriticVerdict(critiques=critiques, pick=pick, feedback="" if pick else feedback)

    def _fall_back(self, ctx: AgentContext, candidates: list[Candidate], reason: str) -> CriticVerdict:
        name = getattr(self.fallback, "name", "rules")
        verdict = self.fallback.critique(ctx, candidates)
        self._calls.extend(self.fallback.last_calls())
        self._record_fallback(name, reason)
        note = f"[{name} critic: {reason}]"
        critiques = [cr.model_copy(update={"reasons": [*cr.reasons, note]}) for cr in verdict.critiques]
        return verdict.model_copy(update={"critiques": critiques})


def check_candidate(ctx: AgentContext, c: Candidate) -> CandidateCheck:
    """mart's checks of one candidate: search space, constraints, memory prediction, repeat of a trial."""
    chk = CandidateCheck()
    try:
        overrides = ctx.search_space.validate_overrides(c.overrides, stage=ctx.stage)
    except ConfigError as e:
        chk.validation_errors.append(str(e))
        overrides = dict(c.overrides)
    chk.validation_errors.extend(ctx.policy.stage_refusals(ctx, overrides))
    full = ctx.full_config(overrides)
    try:
        chk.constraint_errors.extend(ctx.config_errors(overrides))
    except Exception as e:  # noqa: BLE001 - a constraint that cannot read a malformed value
        chk.constraint_errors.append(f"cannot check constraints ({e})")
    chk.predicted_memory_gb = _safe_predict(ctx, full)
    chk.duplicate = config_hash(full) in ctx.tried_keys()
    return chk


def usable(chk: CandidateCheck) -> bool:
    return chk.ok and not chk.duplicate


def _over_limit(chk: CandidateCheck, limit_gb: float | None) -> str | None:
    if limit_gb is None or chk.predicted_memory_gb is None or chk.predicted_memory_gb <= limit_gb:
        return None
    return f"predicted peak memory {fmt_gb(chk.predicted_memory_gb)} exceeds the limit {fmt_gb(limit_gb)} (risk set to high)"


def _check_summary(chk: CandidateCheck) -> str:
    parts = [*chk.validation_errors, *chk.constraint_errors]
    if chk.duplicate:
        parts.append("identical to a trial already run")
    return " ".join(parts) or "checks pass"


def _verdict_errors(answer: VerdictSet, ids: list[str]) -> list[str]:
    errors = []
    seen = [v.candidate_id for v in answer.verdicts]
    unknown = [i for i in seen if i not in ids]
    if unknown:
        errors.append(f"unknown candidate_id(s) {unknown}; the candidates are {ids}")
    missing = [i for i in ids if i not in seen]
    if missing:
        errors.append(f"no verdict for {missing}; give exactly one verdict per candidate")
    repeated = sorted({i for i in seen if seen.count(i) > 1})
    if repeated:
        errors.append(f"more than one verdict for {repeated}")
    if answer.pick is not None and answer.pick not in ids:
        errors.append(f"pick {answer.pick!r} is not one of the candidates {ids}")
    elif answer.pick is not None and not any(v.candidate_id == answer.pick and v.accept for v in answer.verdicts):
        errors.append(f"pick {answer.pick!r} is not accepted in your verdicts; pick an accepted candidate or null")
    return errors


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _gain(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return min(GAIN_RANGE[1], max(GAIN_RANGE[0], float(value)))


def _kv(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in d.items())
