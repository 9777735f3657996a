"""The rules strategy (offline default): model-driven search in stage 1, informed moves in stage 2,
diagnosis-driven transitions in stage 3 (``mart.nodes.agents.schedule``).

Proposer, stage 1 with a job model (every shipped backend describes its job): the calibrated per-phase
model (``job_model``) searches the whole catalogue (``model_search``) and proposes the predicted-best
multi-knob bundles that fit under the memory limit with a safety gap, plus trust-region moves around the
incumbent. Without a model (a plugin backend that cannot describe its job), and in stage 2: from the
current best, one-knob moves (x2 / /2, +-step, flip), scored by the phase the knob speeds up, the known
direction, memory headroom, momentum, health signals (stage 2) and reviewer feedback.
Critic: validation, constraints, duplicates, the model's peak against the margin; ranks the rest by
predicted gain discounted by the chance of crossing the limit. In stages 2 and 3 a candidate is never rejected
for memory it does not change (the system config is fixed there). In stage 3 the critic also refuses a repeat of
another transition of the round, and ranks by the severity of the finding a transition answers.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import mart.state.agents as names
from mart.nodes.agents.base import AgentContext, Critic, CriticVerdict, Proposer
from mart.nodes.agents.batch import phase_distance, select_batch
from mart.nodes.agents.feedback import FeedbackRules, parse_feedback
from mart.nodes.agents.model_search import Scored, is_hedge, search
from mart.nodes.agents.schedule import transition_candidates, transition_score
from mart.nodes.knob_effects import effect_of, knob_facts
from mart.state.health import EXPLORATION, INSTABILITY, TEAM, rule_names
from mart.state.models import Candidate, Critique, TrialStatus, config_hash
from mart.state.objectives import LOW_RISK_P_OVER, p_over_limit
from mart.state.search_space import ParamSpec
from mart.state.units import fmt_gb


def _moves(spec: ParamSpec, value: Any) -> list[tuple[str, Any]]:
    """Neighbouring values of a knob: (direction, value); how far by its record's ``move`` rule."""
    spec = knob_facts(spec)
    if spec.kind == "bool":
        return [("up" if not value else "down", not bool(value))]
    if spec.kind == "categorical":
        choices = list(spec.choices or ())
        if value not in choices:
            return [("up", choices[0])]
        i = choices.index(value)
        out = []
        if i + 1 < len(choices):
            out.append(("up", choices[i + 1]))
        if i > 0:
            out.append(("down", choices[i - 1]))
        return out
    assert spec.low is not None and spec.high is not None
    if spec.move == "count" and value is not None:  # one more or one less (debate rounds), not twice as many
        return [(d, v) for d, v in (("up", int(value) + 1), ("down", int(value) - 1)) if spec.low <= v <= spec.high]
    if spec.zero_start is not None and value == 0:  # 0 = off, where doubling stays at 0: the record's start value
        return [("up", spec.validate(min(spec.high, max(spec.low, spec.zero_start))))]
    if value is None:  # a null default (verl's micro batches): start from a small concrete value
        return [("up", spec.validate(max(spec.low, min(spec.high, 4 if spec.kind == "int" else spec.low))))]
    v = float(value)
    scale = spec.move == "scale" or (spec.move is None and (
        spec.kind in ("int", "log") or (v > 0 and spec.high / max(spec.low, 1e-12) >= 8)))
    if scale:
        ups, downs = v * 2, v / 2
    else:
        step = (spec.high - spec.low) / 5
        ups, downs = v + step, v - step
    out = []
    for direction, nv in (("up", ups), ("down", downs)):
        nv = min(spec.high, max(spec.low, nv))
        if spec.kind == "int":
            nv = int(round(nv))
        else:
            nv = float(f"{nv:.4g}")
        if nv != value:
            out.append((direction, nv))
    return out


def _direction_matches(direction: str, faster: Any) -> bool | None:
    if faster is None:
        return None
    if isinstance(faster, bool):
        return (direction == "up") == faster
    return direction == faster


def _learning_prior(prior: str | None, direction: str, unstable: set[str], collapsed: bool) -> tuple[float, str]:
    """The stage-2 prior of moving one learning knob, by its record's ``prior`` (a per-agent copy of a knob
    carries the knob's)."""
    # priors: GRPO on small models usually gains from a larger lr and more rollouts per prompt
    score, why = 0.2, ""
    if prior == "lr":
        score = 0.8 if direction == "up" else 0.3
        why = "a larger step size learns faster on a short horizon" if direction == "up" else "a smaller step size is safer"
        if unstable:
            score = 1.0 if direction == "down" else 0.05
            why = f"instability seen ({', '.join(sorted(unstable))}): lower the learning rate"
    elif prior == "rollout_n":
        score = 0.5 if direction == "up" else 0.15
        why = "more rollouts per prompt give better group baselines" if direction == "up" else "fewer rollouts, cheaper steps"
    elif prior == "entropy":
        score = 0.7 if collapsed and direction == "up" else 0.15
        why = "entropy collapsed: an entropy bonus keeps exploring" if collapsed else "entropy regularisation"
    elif prior == "temperature":
        score = 0.5 if collapsed and direction == "up" else 0.2 if direction == "down" else 0.1
        why = "sampling temperature shapes exploration"
    elif prior == "clip_high":
        score = 0.45 if direction == "up" else 0.1
        why = "clip-higher (DAPO) lets low-probability tokens grow, against entropy collapse"
    elif prior == "clip_low":
        score = 0.1
        why = "lower clip bound"
    elif prior == "kl":
        score = 0.6 if unstable and direction == "up" else 0.2 if direction == "down" else 0.1
        why = "a KL penalty keeps the policy near the reference" if direction == "up" else "less KL regularisation lets the policy move"
    return score, why


class RulesProposer(Proposer):
    name = "rules"

    def propose(self, ctx: AgentContext) -> list[Candidate]:
        if ctx.traits.branches:  # stage 3: transitions answering the diagnosis at the checkpoint
            return transition_candidates(ctx)
        if ctx.traits.objective == "throughput" and ctx.job_model is not None and ctx.memory_limit_gb:
            # a batch: the critic may spend one slot on a hedge across the model's memory uncertainty
            found = model_candidates(ctx, source=self.name, hedges=HEDGES if ctx.slots > 1 else 0)
            if found:
                return found
        return self._coordinate(ctx)

    def _coordinate(self, ctx: AgentContext) -> list[Candidate]:
        rng = random.Random(ctx.seed * 1000 + ctx.round + 17 * len(ctx.history))
        fb = parse_feedback(ctx.feedback, ctx.search_space)
        start = dict(ctx.best_overrides)
        current = ctx.full_config(start)
        tried = ctx.tried_keys()
        scored: list[tuple[float, float, Candidate]] = []
        for spec in ctx.search_space.stage_params(ctx.stage):
            for direction, value in _moves(spec, current.get(spec.key, spec.default)):
                if not fb.allows(spec.key, direction):
                    continue
                overrides = {**start, spec.key: value}
                if ctx.base_config.get(spec.key, spec.default) == value:
                    overrides.pop(spec.key)  # back to the base value: not an override
                if config_hash(ctx.full_config(overrides)) in tried:
                    continue
                if ctx.search_space.check_constraints(ctx.full_config(overrides)):
                    continue
                score, why = self._score(ctx, spec, direction, current.get(spec.key), value, fb)
                if score <= 0:
                    continue
                pred = ctx.predict_memory(ctx.full_config(overrides))
                cand = Candidate(
                    candidate_id="", stage=ctx.stage, overrides=overrides, source="rules", rationale=why,
                    predicted_memory_gb=pred, expected_gain=round(score, 4),
                )
                scored.append((score, rng.random(), cand))
        if not ctx.traits.branches:  # a multi-agent job: the same move for every agent in one trial
            for overrides, rest, direction, moved in team_moves(ctx, start, current, fb):
                if config_hash(ctx.full_config(overrides)) in tried:
                    continue
                if ctx.search_space.check_constraints(ctx.full_config(overrides)):
                    continue
                if ctx.traits.objective == "score":
                    score, why = self._team_score(ctx, rest, direction, moved, current)
                else:  # a step waits for the slowest agent: a system knob speeds it up when every agent moves
                    first = next(iter(moved))
                    score, why = self._system_score(ctx, ctx.search_space[first], direction, current.get(first),
                                                    moved[first], fb)
                    why = f"all {len(moved)} agents' {rest} the same way. {why}"
                if score <= 0:
                    continue
                cand = Candidate(
                    candidate_id="", stage=ctx.stage, overrides=overrides, source="rules", rationale=why,
                    predicted_memory_gb=ctx.predict_memory(ctx.full_config(overrides)),
                    expected_gain=round(score, 4),
                )
                scored.append((score, rng.random(), cand))
        scored.sort(key=lambda t: (-t[0], t[1]))
        out = []
        seen = set()
        for _, _, cand in scored:
            k = cand.key()
            if k in seen:
                continue
            seen.add(k)
            out.append(cand)
            if len(out) == ctx.num_candidates:
                break
        return out

    # -- scoring ----------------------------------------------------------------------------------
    def _score(self, ctx: AgentContext, spec: ParamSpec, direction: str, old: Any, new: Any,
               fb: FeedbackRules) -> tuple[float, str]:
        if ctx.traits.objective == "throughput":
            score, why = self._system_score(ctx, spec, direction, old, new, fb)
            agent = names.knob_agent(spec.key)
            if agent is not None and is_multi_agent(ctx):
                score *= 0.5  # the other agents' phases still hold the step: the team move comes first
                why += f" Agent {agent} alone; the others still hold the step."
        else:
            score, why = self._learning_score(ctx, spec, direction, old, new)
        if spec.key in fb.focus:
            score = score * 3 + 0.5
            why += " The reviewer asked for this change."
        return score, why

    def _momentum(self, ctx: AgentContext, key: str, direction: str) -> float:
        """+1 when moving this knob this way improved on its stage's best before, -1 when it hurt."""
        stage_trials = [t for t in ctx.history if t.stage == ctx.stage]
        base = next((t for t in stage_trials if t.kind == "baseline"), None)
        if base is None:
            return 0.0
        m = 0.0
        for t in stage_trials:
            if t.kind == "baseline" or key not in t.config or t.config.get(key) == base.config.get(key):
                continue
            moved_up = _greater(t.config.get(key), base.config.get(key))
            if moved_up is None or (direction == "up") != moved_up:
                continue
            obj, ref = t.objective(ctx.stage), base.objective(ctx.stage)
            if t.status in (TrialStatus.OOM, TrialStatus.FAILED) or t.early_stopped:
                m -= 1.0
            elif obj is not None and ref is not None:
                m += 1.0 if obj > ref else -0.5
        return m

    def _system_score(self, ctx, spec, direction, old, new, fb) -> tuple[float, str]:
        eff = effect_of(spec)
        phase_share = {p.name: p.share for p in ctx.profile.phases} if ctx.profile else {}
        share = phase_share.get(eff.phase, 0.25 if eff.phase == "all" else 0.05)
        faster = _direction_matches(direction, eff.faster)
        mem_up = (
            (eff.memory_elasticity > 0 and direction == "up") or (eff.memory_elasticity < 0 and direction == "down")
            or (eff.memory_factor_on > 1 and direction == "up") or (eff.memory_factor_on < 1 and direction == "down")
        )
        headroom = ctx.profile.memory_headroom_gb if ctx.profile else None
        limit = ctx.memory_limit_gb
        pred = ctx.predict_memory(ctx.full_config({**ctx.best_overrides, spec.key: new}))
        score = share * (1.0 if faster else 0.35 if faster is None else 0.08)
        if mem_up and limit and pred is not None and pred > limit:
            score *= 0.05
        if fb.prefer_low_memory and mem_up:
            score *= 0.2
        m = self._momentum(ctx, spec.key, direction)
        score *= 1.0 + 0.5 * max(-1.5, min(m, 2.0))
        phase_txt = f"{eff.phase} takes {share:.0%} of the step" if eff.phase in phase_share else "a general knob"
        mem_txt = ""
        if pred is not None and limit:
            mem_txt = f"; predicted peak {fmt_gb(pred)} vs limit {fmt_gb(limit)}"
        elif headroom is not None:
            mem_txt = f"; memory headroom {fmt_gb(headroom)}"
        verb = "speeds up" if faster else "may speed up" if faster is None else "trades speed for memory in"
        note = eff.note_for(faster)  # the note of this move's direction: a smaller micro batch is not "larger"
        why = (f"{spec.key}: {old!r} -> {new!r}. {phase_txt}; this {verb} that phase"
               f"{' (' + note + ')' if note else ''}{mem_txt}.")
        if m > 0:
            why += " Moving it this way already paid off."
        return max(score, 0.0), why

    def _learning_score(self, ctx, spec, direction, old, new) -> tuple[float, str]:
        key = spec.key
        rules = {e.rule for e in ctx.health_events if e.trial_id in {t.trial_id for t in ctx.history
                                                                      if t.stage == ctx.stage}}
        unstable = rules & rule_names(INSTABILITY)
        collapsed = bool(rules & rule_names(EXPLORATION))
        score, why = _learning_prior(knob_facts(spec).prior, direction, unstable, collapsed)
        score, why = multi_agent_move(ctx, key, direction, score, why, new=new)
        m = self._momentum(ctx, key, direction)
        score *= 1.0 + 0.5 * max(-1.5, min(m, 2.0))
        why = f"{key}: {old!r} -> {new!r}. {why}."
        if m > 0:
            why += " Moving it this way already paid off."
        return max(score, 0.0), why

    def _team_score(self, ctx, rest: str, direction: str, moved: dict[str, Any], current: dict[str, Any]
                    ) -> tuple[float, str]:
        """A team move: the single-agent prior of ``rest``, read on the team's own health (a finding about one
        agent is answered by that agent's knobs first), and the momentum of every moved agent's key."""
        trials = {t.trial_id for t in ctx.history if t.stage == ctx.stage}
        team_rules = {e.rule for e in ctx.health_events if e.trial_id in trials and e.agent is None}
        prior = knob_facts(ctx.search_space[next(iter(moved))]).prior  # every moved key: a copy of one knob
        score, why = _learning_prior(prior, direction, team_rules & rule_names(INSTABILITY),
                                     bool(team_rules & rule_names(EXPLORATION)))
        f = agent_findings(ctx)
        sick = sorted(set(f.health) | f.copying)
        if sick:
            score *= 0.3
            why += f" (the findings are about agent(s) {', '.join(map(str, sick))}: their own knobs come first)"
        ms = [self._momentum(ctx, key, direction) for key in moved]
        m = sum(ms) / len(ms)
        score *= 1.0 + 0.5 * max(-1.5, min(m, 2.0))
        # every agent at once is a large move: past 4x (or 1/4) the base value, each further doubling halves the
        # prior, so other team moves (shaping, rounds) get their trial before a step that risks the whole team
        far = max(_doublings(ctx.base_config.get(k, ctx.search_space[k].default), v) for k, v in moved.items())
        if far > 2:
            score *= 0.5 ** (far - 2)
            why += f" (each agent's value {2 ** far:g}x from the base: a large step for the whole team)"
        olds = sorted({repr(current.get(k)) for k in moved})
        news = sorted({repr(v) for v in moved.values()})
        why = (f"all {len(moved)} agents' {rest}: {'/'.join(olds)} -> {'/'.join(news)}. {why}; one trial moves "
               "every agent (one agent's step alone is worth a fraction of the team's gain, often within the noise).")
        if m > 0:
            why += " Moving it this way already paid off."
        return max(score, 0.0), why


# -- multi-agent jobs ----------------------------------------------------------------------------------
# A finding about one agent (its own stream collapsed or blew up, it copies the others, it takes all the
# reward) moves *that agent's* knobs (``agents.<i>.<rest>``) first and leaves the healthy agents' alone;
# reward concentration re-shapes the team's reward (MARTI's shaping alpha/mode/scope); debate rounds that
# change no answer suggest fewer rounds. Knobs shared by all agents keep the single-agent scores above. A
# remedy scores above the single-agent priors (0.8 at most without a finding): a finding outranks a prior.



@dataclass
class AgentFindings:
    """The learning stage's health findings of a multi-agent job, by agent."""

    health: dict[int, set[str]] = field(default_factory=dict)
    """Single-agent rules each agent's own stream raised (entropy_collapse, kl_blowup, ...)."""
    copying: set[int] = field(default_factory=set)
    concentrated: set[int] = field(default_factory=set)
    """Agents that took nearly all of the team's reward."""
    stale_rounds: bool = False

    def __bool__(self) -> bool:
        return bool(self.health or self.copying or self.concentrated or self.stale_rounds)


def agent_findings(ctx: AgentContext) -> AgentFindings:
    """What the health monitor found about each agent in this stage's trials."""
    trials = {t.trial_id for t in ctx.history if t.stage == ctx.stage}
    f = AgentFindings()
    for e in ctx.health_events:
        if e.trial_id not in trials:
            continue
        if e.rule == "stale_debate_rounds":
            f.stale_rounds = True
        elif e.agent is None:
            continue
        elif e.rule == "agent_copying":
            f.copying.add(e.agent)
        elif e.rule == "reward_concentration":
            f.concentrated.add(e.agent)
        elif e.rule not in rule_names(TEAM):
            f.health.setdefault(e.agent, set()).add(e.rule)
    return f


def _agent_remedy(prior: str | None, direction: str, rules: set[str], copying: bool) -> tuple[float, str] | None:
    """The score of moving one of a sick agent's own knobs (``prior``: the knob record's)."""
    if rules & rule_names(INSTABILITY):
        if prior == "lr":
            return (1.2, "lower its learning rate") if direction == "down" else (0.02, "a larger step would worsen it")
        if prior == "kl":
            return (0.9, "raise its KL penalty to hold it near the reference") if direction == "up" else (
                0.05, "less KL would let it drift further")
    collapsed = bool(rules & rule_names(EXPLORATION))
    if collapsed or copying:
        if prior == "entropy" and direction == "up":
            return 0.9, "an entropy bonus keeps it exploring"
        if prior == "temperature" and direction == "up":
            return 0.75, "a higher sampling temperature gives it answers of its own"
        if prior == "clip_high" and direction == "up":
            return 0.6, "clip-higher (DAPO) lets its low-probability tokens grow"
        if prior == "lr" and direction == "down" and collapsed:
            return 0.8, "a smaller step collapses more slowly"
    return None


def is_multi_agent(ctx: AgentContext) -> bool:
    """Two or more agents own knobs of this stage (``agents.<i>.<key>``)."""
    return len(names.agents_in_config(s.key for s in ctx.search_space.stage_params(ctx.stage))) >= 2


def team_moves(ctx: AgentContext, start: dict[str, Any], current: dict[str, Any], fb: FeedbackRules
               ) -> list[tuple[dict[str, Any], str, str, dict[str, Any]]]:
    """Coordinated moves of a multi-agent job: for each per-agent knob (``agents.<i>.<rest>``) that two or
    more agents own, every agent's value moved the same way (x2 / /2, +-step, flip) in one config.
    Returns (overrides, rest, direction, {key: new value}); empty for a single-agent job."""
    groups: dict[str, list[ParamSpec]] = {}
    for spec in ctx.search_space.stage_params(ctx.stage):
        agent, rest = names.split_knob(spec.key)
        if agent is not None:
            groups.setdefault(rest, []).append(spec)
    out = []
    for rest, specs in groups.items():
        if len(specs) < 2:
            continue
        for direction in ("up", "down"):
            moved = {}
            for spec in specs:
                new = dict(_moves(spec, current.get(spec.key, spec.default))).get(direction)
                if new is not None and fb.allows(spec.key, direction):
                    moved[spec.key] = new
            if len(moved) < 2:
                continue
            overrides = {**start, **moved}
            for key, value in moved.items():
                if ctx.base_config.get(key, ctx.search_space[key].default) == value:
                    overrides.pop(key)  # back to the base value: not an override
            out.append((overrides, rest, direction, moved))
    return out


def _doublings(base: Any, value: Any) -> float:
    """|log2(value / base)| for positive numbers (0 otherwise)."""
    try:
        b, v = float(base), float(value)
    except (TypeError, ValueError):
        return 0.0
    return abs(math.log2(v / b)) if b > 0 and v > 0 else 0.0


def _shaping_on(config: dict[str, Any]) -> bool:
    mode = config.get(names.SHAPING_MODE)
    if mode is not None and str(mode).lower() in ("none", "off", "false"):
        return False
    alpha = config.get(names.SHAPING_ALPHA)
    return not (alpha is not None and float(alpha) == 0.0)


def _team_knob_prior(ctx: AgentContext, key: str, direction: str, score: float, why: str, new: Any
                     ) -> tuple[float, str]:
    """Priors of a multi-agent job without a finding about the knob's agent: the team's reward shaping and
    rounds (MARTI's ablation: shaping is worth a large part of the multi-agent gain; more debate rounds
    let answers converge, Du et al. 2023), and a healthy agent's own knob waits for the team move."""
    agent, _ = names.split_knob(key)
    if agent is not None:
        # the team's trials count as this agent's momentum too: past 4x its base value a lone step is as
        # large as a team step there, and halves the same way
        far = _doublings(ctx.base_config.get(key, ctx.search_space[key].default if key in ctx.search_space else None), new)
        return score * 0.4 * 0.5 ** max(0.0, far - 2), (
            f"{why} (agent {agent} alone: the same move for all agents comes first)")
    current = ctx.full_config(ctx.best_overrides)
    on = _shaping_on(current)
    if key == names.SHAPING_MODE:
        if not on and _shaping_on({**current, key: new}):
            return 0.82, ("reward shaping is off: MARTI's ablation loses most of the multi-agent gain without it "
                          "(45.6 -> 36.6 on its Qwen2.5-3B debate); each agent's reward gains its own margin")
        if on and _shaping_on({**current, key: new}):
            return 0.3, "another shaping mode changes how each agent's margin over its history counts"
        return 0.05, "turning reward shaping off loses the per-agent credit"
    if key == names.SHAPING_ALPHA:
        if names.SHAPING_MODE in current and str(current[names.SHAPING_MODE]).lower() in ("none", "off", "false"):
            return 0.02, "alpha does nothing while shaping is off"
        if not on and direction == "up":
            return 0.82, "shaping alpha 0 turns shaping off: a positive alpha gives each agent its own margin"
        return 0.35, f"a {'larger' if direction == 'up' else 'smaller'} shaping alpha weighs each agent's margin"
    if key == names.HISTORY_SCOPE:
        return (0.2 if on else 0.02), "the history scope sets each agent's reference Q"
    if key == names.NUM_ROUNDS:
        if direction == "up":
            return 0.5, "another debate round lets agents correct each other's answers"
        return 0.2, "fewer rounds cost less generation"
    return score, why


def multi_agent_move(ctx: AgentContext, key: str, direction: str, score: float, why: str, new: Any = None
                     ) -> tuple[float, str]:
    """Re-score a stage-2 move with the multi-agent findings and priors (unchanged for a single-agent job)."""
    if not is_multi_agent(ctx):
        return score, why
    f = agent_findings(ctx)
    if not f:
        return _team_knob_prior(ctx, key, direction, score, why, new)
    agent, rest = names.split_knob(key)
    if agent is not None:
        own = f.health.get(agent, set())
        copying = agent in f.copying
        if own or copying:
            remedy = _agent_remedy(knob_facts(ctx.search_space[key]).prior if key in ctx.search_space else None,
                                   direction, own, copying)
            if remedy is not None:
                shown = sorted(own | ({"agent_copying"} if copying else set()))
                return remedy[0], f"agent {agent} showed {', '.join(shown)} while this stage ran: {remedy[1]}"
            return score, why
        sick = sorted(set(f.health) | f.copying)
        if sick:  # the finding is about another agent: this one is healthy, leave its knobs for later
            who = ", ".join(map(str, sick))
            return score * 0.3, f"{why} (agent {agent} is healthy; the findings are about agent(s) {who})"
        return _team_knob_prior(ctx, key, direction, score, why, new)
    if f.concentrated and key in names.SHAPING_KNOBS:
        # MARTI's R~ = R + alpha * Delta, Delta against the agent's own history Q: which way a change evens
        # the shares depends on the agents' histories, so the re-shaping moves are trials, not a known direction
        who = f"the reward concentrated on agent(s) {', '.join(map(str, sorted(f.concentrated)))}"
        if key == names.SHAPING_MODE:
            return 0.9, f"{who}: re-shape it with another shaping mode (none / margin / quality)"
        if key == names.SHAPING_ALPHA:
            return (0.87 if direction == "up" else 0.84), (
                f"{who}: re-shape it, a {'larger' if direction == 'up' else 'smaller'} alpha changes how much of "
                "each agent's reward comes from beating its own history")
        return 0.5, f"{who}: another history scope changes each agent's reference Q"
    if f.stale_rounds and key == names.NUM_ROUNDS:
        if direction == "down":
            return 0.85, "debate rounds changed no answer: fewer rounds cost less generation for the same answers"
        return 0.05, "more rounds would change nothing either"
    return _team_knob_prior(ctx, key, direction, score, why, new)


def model_candidates(ctx: AgentContext, source: str = "rules", n: int | None = None, hedges: int = 0) -> list[Candidate]:
    """The job model's best untried configs for stage 1 (reviewer feedback applied), as candidates; then up to
    ``hedges`` configs that fit by the model's estimate but not with its safety gap (``search(hedges=True)``)."""
    fb = parse_feedback(ctx.feedback, ctx.search_space)
    if ctx.job_model is None or ctx.memory_limit_gb is None:
        return []  # no model or no margin to search under: the coordinate rules propose instead
    found = search(ctx.job_model, ctx.search_space, ctx.base_config, ctx.memory_limit_gb,
                   incumbent=ctx.best_overrides, tried=ctx.tried_keys(), check=ctx.config_errors,
                   n_out=4 * (n or ctx.num_candidates), stage=ctx.stage)
    base_pred = ctx.job_model.predict(ctx.best_overrides)
    found = [s for s in found if _follows_feedback(s, ctx, fb)]
    if fb.focus:
        # the knobs the reviewer asked to move come first; when the model found no config that moves one, the
        # coordinate proposer (which does) answers instead of the model's picks that ignore the request
        asked = [s for s in found if _moves_focus(s, ctx, fb)]
        if not asked:
            return []
        found = asked + [s for s in found if s not in asked]
    out: list[Candidate] = []
    for s in found:
        out.append(_model_candidate(ctx, s, base_pred, source, fb))
        if len(out) == (n or ctx.num_candidates):
            break
    if out and hedges and not fb.focus:  # a reviewer's request is answered by the picks above, not by a bet
        risky = search(ctx.job_model, ctx.search_space, ctx.base_config, ctx.memory_limit_gb,
                       incumbent=ctx.best_overrides, tried=ctx.tried_keys(), check=ctx.config_errors,
                       n_out=4 * hedges, stage=ctx.stage, hedges=True)
        out += [_model_candidate(ctx, s, base_pred, source, fb, hedge=True)
                for s in risky if _follows_feedback(s, ctx, fb)][:hedges]
    return out


#: hedges offered to the critic per batch (it runs at most one, ``RulesCritic._hedged_batch``)
HEDGES = 3


def _model_candidate(ctx: AgentContext, s: Scored, base_pred: Any, source: str, fb: FeedbackRules,
                     hedge: bool = False) -> Candidate:
    note = " The reviewer asked for this change." if _moves_focus(s, ctx, fb) else ""
    if hedge:
        note += (f" A hedge for a batch: it fits by the model's estimate but not with its safety gap "
                 f"(P(over the limit) {s.p_over:.0%}); measuring it tells the next proposals how much room there is.")
    return Candidate(
        candidate_id="", stage=ctx.stage, overrides={**s.overrides}, source=source,
        rationale=_model_rationale(ctx, s, base_pred) + note,
        predicted_memory_gb=round(s.peak_gb, 3),
        predicted_throughput=round(s.throughput, 3),
        expected_gain=round(s.throughput / max(base_pred.throughput, 1e-9) - 1, 4))


def _moves_focus(s: Scored, ctx: AgentContext, fb: FeedbackRules) -> bool:
    """The config moves a knob the reviewer asked to move."""
    inc = ctx.full_config(ctx.best_overrides)
    return any(k in fb.focus and inc.get(k, ctx.base_config.get(k)) != v for k, v in s.overrides.items())


def _follows_feedback(s: Scored, ctx: AgentContext, fb: FeedbackRules) -> bool:
    inc = ctx.full_config(ctx.best_overrides)
    for key, value in s.overrides.items():
        old = inc.get(key, ctx.base_config.get(key))
        if old == value:
            continue
        up = _greater(value, old)
        if up is not None and not fb.allows(key, "up" if up else "down"):
            return False
    return True


def _model_rationale(ctx: AgentContext, s: Scored, base_pred: Any) -> str:
    inc = ctx.full_config(ctx.best_overrides)
    moves = [f"{k.split('.')[-1]} {inc.get(k)!r}->{v!r}" for k, v in s.overrides.items() if inc.get(k) != v]
    gain = s.throughput / max(base_pred.throughput, 1e-9) - 1
    slow = max(s.phase_s, key=lambda p: s.phase_s[p]) if s.phase_s else "?"
    binding = max(s.phase_gb, key=lambda p: s.phase_gb[p]) if s.phase_gb else "?"
    return (f"job model: predicted {gain:+.1%} tok/s over the incumbent ({s.throughput:.0f} tok/s/GPU), peak "
            f"{fmt_gb(s.peak_gb)} in {binding} (limit {fmt_gb(ctx.memory_limit_gb)}, safety gap {fmt_gb(s.gap_gb)}); "
            f"slowest phase {slow}. Moves: {', '.join(moves) or 'none'}.")


def _greater(a: Any, b: Any) -> bool | None:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) and not bool(b)
    try:
        return float(a) > float(b)
    except (TypeError, ValueError):
        return None


_RISK_WEIGHT = {"low": 1.0, "medium": 0.8, "high": 0.5}

#: stages 2 and 3: the memory a candidate must add over the stage's base config (a share of the limit) before its
#: predicted peak is held against it; below it, the prediction's difference is the model's noise, not the candidate's
ADDED_MEMORY_SHARE = 0.01


@dataclass
class _Memory:
    """What the critic holds against a candidate's predicted peak."""

    pred: float | None
    risk: str
    p_over: float = 0.0
    over: str | None = None
    """Why it is refused (predicted over the limit), or None."""


@dataclass
class _Judge:
    """One critique round: what every candidate is judged against (the stage's policy asks the questions)."""

    ctx: AgentContext
    tried: set[str]
    inc_pred: Any
    stage_base: float | None
    focus: set[str]
    current: dict[str, Any]
    siblings: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, ctx: AgentContext) -> "_Judge":
        current = ctx.full_config(ctx.best_overrides)
        return cls(ctx=ctx, tried=ctx.tried_keys(), inc_pred=ctx.predict(current),
                   stage_base=ctx.policy.memory_reference(ctx),
                   focus=set(parse_feedback(ctx.feedback, ctx.search_space).focus), current=current)

    def critique(self, cand: Candidate) -> Critique:
        ctx = self.ctx
        reasons = ctx.policy.admissible(ctx, cand.overrides, tried=self.tried, siblings=self.siblings)
        full = ctx.full_config(cand.overrides)
        model_pred = ctx.predict(full) if not reasons else None
        mem = self.memory(ctx.predict_memory(full), model_pred)
        if mem.over:
            reasons.append(mem.over)
        accepted = not reasons
        gain, score, answers = self.rank(cand, model_pred, mem, accepted)
        asked = sorted(k for k, v in cand.overrides.items() if k in self.focus and self.current.get(k) != v)
        if accepted and asked:
            # the reviewer's request outranks the model's forecast: a knob they asked to move goes first
            score += 1.0
            reasons.append(f"moves {', '.join(ctx.search_space.edit_name(k) for k in asked)}, as the reviewer asked")
        if accepted:
            reasons += self.passes(model_pred, mem, gain, answers)
        return Critique(candidate_id=cand.candidate_id, accepted=accepted, reasons=reasons,
                        predicted_memory_gb=mem.pred, risk=mem.risk, score=round(score, 4))

    def memory(self, pred: float | None, model_pred: Any) -> _Memory:
        """The memory rule: refused when predicted over the limit, else a risk of going over it."""
        limit, stage_base = self.ctx.memory_limit_gb, self.stage_base
        mem = _Memory(pred, "medium" if pred is None and self.ctx.traits.memory_bound else "low")
        if pred is None or not limit:
            return mem
        # stage 2 fixes the system config: only memory the candidate adds can be held against it (a tolerance
        # relative to the limit: an absolute one dwarfed a small job's whole limit, issue 43)
        changes_memory = stage_base is None or pred > stage_base + ADDED_MEMORY_SHARE * limit
        if pred > limit:  # never "risk low"; refused when the candidate adds the memory that crosses it
            mem.risk = "high"
            if changes_memory:
                mem.over = f"predicted peak memory {fmt_gb(pred)} exceeds the limit {fmt_gb(limit)}"
        elif model_pred is not None and changes_memory:
            mem.p_over = p_over_limit(pred, model_pred.gap_gb, limit)
            mem.risk = "high" if mem.p_over > 0.2 else "medium" if mem.p_over > LOW_RISK_P_OVER else "low"
        elif pred > 0.9 * limit and changes_memory:
            mem.risk = "high"
        elif pred > 0.75 * limit and changes_memory:
            mem.risk = "medium"
        return mem

    def rank(self, cand: Candidate, model_pred: Any, mem: _Memory, accepted: bool
             ) -> tuple[float, float, str | None]:
        """The candidate's predicted gain, its score, and the finding it answers (a schedule's transition)."""
        ctx = self.ctx
        if model_pred is not None and self.inc_pred is not None and ctx.traits.objective == "throughput":
            gain = model_pred.throughput / max(self.inc_pred.throughput, 1e-9) - 1
            return gain, (max(1e-4, (1 + gain) * (1 - 1.5 * mem.p_over)) if accepted else 0.0), None
        answers = None
        if ctx.traits.branches:  # rank by the severity of the finding the transition answers
            gain, answers = transition_score(ctx, cand.overrides)
        else:
            gain = cand.expected_gain if cand.expected_gain is not None else 0.1
        return gain, (gain * _RISK_WEIGHT[mem.risk] if accepted else 0.0), answers

    def passes(self, model_pred: Any, mem: _Memory, gain: float, answers: str | None) -> list[str]:
        txt = fmt_gb(mem.pred, "unknown")
        if model_pred is not None and self.ctx.traits.objective == "throughput":
            txt += (f", predicted {gain:+.1%} tok/s ({model_pred.throughput:.0f} tok/s/GPU), "
                    f"P(over the limit) {mem.p_over:.0%}")
        return [f"passes constraints; predicted peak {txt}; risk {mem.risk}", *([f"answers: {answers}"] if answers else [])]


class RulesCritic(Critic):
    name = "rules"

    def critique(self, ctx: AgentContext, candidates: list[Candidate]) -> CriticVerdict:
        judge = _Judge.of(ctx)
        critiques = [judge.critique(cand) for cand in candidates]
        ranked = sorted((c for c in critiques if c.accepted), key=lambda c: -c.score)
        if ranked:
            # a batch (several free slots): spread away from each other and from the trials still running
            picks = self._batch(ctx, candidates, ranked)
            picks = picks or [ranked[0].candidate_id]
            return CriticVerdict(critiques=critiques, pick=picks[0], picks=picks)
        return CriticVerdict(critiques=critiques, pick=None, feedback=rejection_summary(critiques))

    @staticmethod
    def _batch(ctx: AgentContext, candidates: list[Candidate], ranked: list[Critique]) -> list[str]:
        """``ctx.slots`` picks, spread apart: in stage 1 with a job model, by what it predicts of each phase (configs
        it predicts alike would teach it the same thing), else by knob steps."""
        by_id = {c.candidate_id: c for c in candidates}
        configs = {c.candidate_id: ctx.full_config(by_id[c.candidate_id].overrides) for c in ranked}
        anchors = [t.config for t in ctx.pending]
        if ctx.slots > 1 and ctx.traits.objective == "throughput" and ctx.job_model is not None:
            preds = {cid: ctx.predict(cfg) for cid, cfg in configs.items()}
            pending = [getattr(ctx.predict(cfg), "phase_s", None) for cfg in anchors]
            known = {cid: p.phase_s for cid, p in preds.items() if p is not None and p.phase_s}
            known_pending = [p for p in pending if p]
            if len(known) == len(preds) and len(known_pending) == len(pending):
                return RulesCritic._hedged_batch(ctx, ranked, preds, known, known_pending)
        return select_batch([(c.candidate_id, c.score, configs[c.candidate_id]) for c in ranked], ctx.slots, anchors)

    @staticmethod
    def _hedged_batch(ctx: AgentContext, ranked: list[Critique], preds: dict[str, Any],
                      phases: dict[str, dict[str, float]], pending: list[dict[str, float]]) -> list[str]:
        """Safe picks spread by predicted phases, and one slot for a hedge (docs/runtime.md, "A hedge per
        batch"): only beside a safe pick, and only one predicted faster than every safe pick."""
        limit = ctx.memory_limit_gb
        hedge = {cid for cid, p in preds.items() if limit is not None and is_hedge(p.peak_gb, p.gap_gb, limit)}
        scored = [(c.candidate_id, c.score, phases[c.candidate_id]) for c in ranked]
        safe = [t for t in scored if t[0] not in hedge]
        hedges = [t for t in scored if t[0] in hedge]
        picks = select_batch(safe, ctx.slots - 1 if hedges else ctx.slots, pending, distance=phase_distance)
        if not picks:  # nothing safe: every accepted candidate competes, as in a batch of one
            return select_batch(scored, ctx.slots, pending, distance=phase_distance)
        if not hedges:
            return picks
        fastest = max(preds[c].throughput for c in picks)
        taken = select_batch([h for h in hedges if preds[h[0]].throughput > fastest], 1,
                             [*pending, *(phases[c] for c in picks)], distance=phase_distance)
        # no hedge worth it: the slot goes to the next safe pick
        return picks + taken if taken else select_batch(safe, ctx.slots, pending, distance=phase_distance)


def rejection_summary(critiques: list[Critique]) -> str:
    """"rejected every candidate: REASON (c0, c2); REASON2 (c1)": each reason once, with the candidates it
    applies to (the node prefixes "critic"; three equal reasons read as one)."""
    by_reason: dict[str, list[str]] = {}
    for c in critiques:
        if c.reasons:
            by_reason.setdefault(c.reasons[0], []).append(c.candidate_id)
    if not by_reason:
        return "rejected every candidate (no candidates)"
    return "rejected every candidate: " + "; ".join(f"{r} ({', '.join(ids)})" for r, ids in by_reason.items())
