"""Training-health rules: pure functions over a trial's metric records, with persistence windows, in a registry.

Each rule looks at the whole stream so far (read through ``mart.state.trajectory``) and returns at most one
``HealthEvent``; ``severity="stop"`` means the anomaly persisted for its window and the trial should end early.
Thresholds are relative to the trial's own early steps where possible, so the rules transfer between the CPU
workload and verl. A multi-agent job's metrics go through the same rules once per agent, plus its own
pathologies (copying, reward concentration, debate rounds that change nothing): see the section at the end.

Every rule is registered (``register_rule``, as verl registers its advantage estimators and policy losses) with
the **kind** of trouble it finds, the stages it watches, and whether it also reads each agent's own stream. The
monitor runs ``rules_for(stage)`` (``mart.nodes.health_rules.evaluate``); the agents and the stage-2/3 choices ask
for kinds (``rule_names(INSTABILITY)``), never for hand-kept lists of rule names.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Literal

from mart.state.agents import (
    AGREEMENT,
    ANSWER_CHANGE_RATE,
    COPY_RATE,
    REWARD_SHARE,
    agent_metric,
    agents_in_records,
)
from mart.state.metrics import DEVICE_MEMORY_KEY, MEMORY_KEYS, StepRecord
from mart.state.models import HealthEvent
from mart.state.stages import KnobStage, traits
from mart.state.trajectory import Trajectory, persisting, trailing


@dataclass(frozen=True)
class HealthConfig:
    window: int = 3
    """Consecutive steps an anomaly must persist before it stops a trial."""
    warmup: int = 2
    """Steps used as the trial's own reference (entropy, grad norm, reward)."""
    entropy_collapse_ratio: float = 0.15
    """Entropy below this fraction of its early level = collapse."""
    kl_max: float = 1.0
    """actor/ppo_kl or actor/kl_loss whose magnitude is above this (either sign) = KL blow-up."""
    grad_norm_factor: float = 10.0
    """Grad norm above this multiple of its early median = explosion."""
    reward_collapse_ratio: float = 0.5
    """Reward below this fraction of its best so far (after warm-up) = collapse."""
    stagnation_steps: int = 12
    """No reward improvement for this many steps = stagnation (a warning only)."""
    clip_ratio_max: float = 0.2
    """response_length/clip_ratio above this and rising = responses truncated (verl: >0.1 is too much)."""
    memory_limit_gb: float | None = None
    """Stage 1: peak memory above this limit (the margin rule) stops the trial."""
    # multi-agent pathologies (docs/agents.md, "Multi-agent jobs", says why these values)
    copy_rate_max: float = 0.8
    """agent<i>/copy_rate above this, and not falling = the agent repeats another agent's answers."""
    reward_share_max: float = 0.9
    """agent<i>/reward_share above this (2+ agents) = the team's reward concentrates on one agent."""
    answer_change_min: float = 0.02
    """workflow/answer_change_rate at or below this = a debate round changed no answer."""
    stale_rounds_steps: int = 10
    """Steps of rounds that change no answer before it is reported (a warning only)."""
    num_rounds: int | None = None
    """The trial's ``workflow.num_rounds`` when it has one: with a single round no answer can change, so the
    stale-rounds rule has nothing to say."""
    pathology_stop_steps: int = 12
    """Copying or reward concentration persisting this long while the team's reward has not improved since it
    began stops the trial; shorter, or while the team still improves, it is a warning."""


Rule = Callable[[str, list[StepRecord], HealthConfig], "HealthEvent | None"]
TeamRule = Callable[[str, list[StepRecord], HealthConfig], list[HealthEvent]]

# -- the registry --------------------------------------------------------------------------------------------
Kind = Literal["instability", "exploration", "truncation", "stagnation", "memory", "team"]
INSTABILITY: Kind = "instability"
"""The run breaks or blows up (non-finite values, KL or grad-norm blow-up, reward collapse): a smaller step."""
EXPLORATION: Kind = "exploration"
"""Exploration collapses (entropy): an entropy bonus, clip-higher, a hotter sampling temperature."""
TRUNCATION: Kind = "truncation"
"""Responses cut at the length limit: a larger length budget."""
STAGNATION: Kind = "stagnation"
"""The reward stops improving (a warning only)."""
MEMORY: Kind = "memory"
"""Stage 1's memory margin: the config is infeasible."""
TEAM: Kind = "team"
"""A multi-agent job's own pathologies (copying, reward concentration, stale debate rounds)."""
UNHEALTHY: tuple[Kind, ...] = (INSTABILITY, EXPLORATION, TRUNCATION)
"""Kinds whose events (warnings included) mark a trajectory as unhealthy: stage 2's and stage 3's collapse
signals (``mart.state.objectives.collapse_signals``)."""
Stage = KnobStage  # the rules of a throughput stage, or of a score stage (``StageTraits.health_rules``)


@dataclass(frozen=True)
class HealthRule:
    name: str
    """The ``rule`` of the events it raises (the ledger's key)."""
    kind: Kind
    stages: tuple[Stage, ...]
    """``learning`` also watches the schedule stage's trials."""
    check: Callable
    per_agent: bool = True
    """Also run on each agent's own stream of a multi-agent job (a team rule reads the team's stream itself)."""
    team: bool = False
    """A multi-agent rule: returns a list of events (one per agent it finds), runs once per trial."""


HEALTH_RULES: dict[str, HealthRule] = {}
"""name -> rule, in registration (= evaluation) order."""


def register_rule(name: str, *, kind: Kind, stages: tuple[Stage, ...], per_agent: bool = True,
                  team: bool = False) -> Callable[[Callable], Callable]:
    """Register a health rule under ``name`` (a decorator; the name is the ``rule`` of its events)."""
    def decorator(check: Callable) -> Callable:
        if name in HEALTH_RULES:
            raise ValueError(f"health rule `{name}` is registered twice")
        HEALTH_RULES[name] = HealthRule(name, kind, stages, check, per_agent=per_agent and not team, team=team)
        return check
    return decorator


def get_rule(name: str) -> HealthRule:
    if name not in HEALTH_RULES:
        raise ValueError(f"`{name}` is not a health rule; known: {', '.join(HEALTH_RULES)}")
    return HEALTH_RULES[name]


def rules_for(stage: str, *, agent: bool = False, team: bool = False) -> tuple[HealthRule, ...]:
    """The rules the monitor runs in ``stage`` (any stage but ``system`` is watched as ``learning``): on the
    trial's stream, on one agent's own stream (``agent``), or the multi-agent rules (``team``)."""
    watched = traits(stage).health_rules
    return tuple(r for r in HEALTH_RULES.values() if watched in r.stages and r.team == team
                 and (not agent or r.per_agent))


def rule_names(*kinds: Kind) -> frozenset[str]:
    """The names of the rules of these kinds."""
    return frozenset(r.name for r in HEALTH_RULES.values() if r.kind in kinds)


def kind_of(rule: str) -> Kind | None:
    """The kind of a rule by its name (None for a name no rule has: an old ledger's, a typo)."""
    r = HEALTH_RULES.get(rule)
    return r.kind if r else None


def _series(records: list[StepRecord], *keys: str) -> list[tuple[int, float]]:
    """The rules' reading of a stream: per step the first of ``keys`` it holds, from step 1 (step 0 is
    verl's validation before training)."""
    return Trajectory(records).series(*keys, since=1)


def _event(trial_id, step, rule, persisted, window, message, value) -> HealthEvent:
    severity = "stop" if persisted >= window else "warn"
    return HealthEvent(trial_id=trial_id, step=step, rule=rule, severity=severity,
                       message=f"{message} ({persisted}/{window} steps)", value=value)


WATCHED = ("actor/entropy", "actor/grad_norm", "actor/pg_loss", "critic/score/mean", "actor/ppo_kl")
#: a non-finite value of these means the run is broken: stop at once
HARD_NAN = ("actor/entropy", "actor/pg_loss", "critic/score/mean", "actor/ppo_kl")
GRAD_NORM = "actor/grad_norm"


@register_rule("nan", kind=INSTABILITY, stages=("system", "learning"))
def nan_metrics(trial_id: str, records: list[StepRecord], cfg: HealthConfig) -> HealthEvent | None:
    """NaN/inf in core training metrics, read on every step since step 1 (not only the newest record).

    A non-finite loss, entropy, score or KL stops the trial at once. A non-finite grad norm alone does not:
    verl skips that update and goes on, so it stops the trial only when it persists for ``window``
    consecutive steps (a warning before).
    """
    for r in records:
        if r.step < 1:
            continue
        bad = [k for k in HARD_NAN if k in r.data and not math.isfinite(r.data[k])]
        if bad:
            return HealthEvent(trial_id=trial_id, step=r.step, rule="nan", severity="stop",
                               message=f"non-finite {', '.join(bad)} at step {r.step}", value=None)
    s = _series(records, GRAD_NORM)
    n = persisting(s, lambda v: not math.isfinite(v), cfg.window)
    skipped = [step for step, v in s if not math.isfinite(v)]
    if n >= cfg.window or (skipped and n):
        return _event(trial_id, skipped[-1], "nan", n, cfg.window,
                      f"non-finite grad norm at steps {skipped} (verl skips those updates)", None)
    if skipped:
        return HealthEvent(trial_id=trial_id, step=skipped[-1], rule="nan", severity="warn",
                           message=f"non-finite grad norm at steps {skipped} (verl skipped those updates; "
                                   "it did not persist)", value=None)
    return None


@register_rule("entropy_collapse", kind=EXPLORATION, stages=("learning",))
def entropy_collapse(trial_id: str, records: list[StepRecord], cfg: HealthConfig) -> HealthEvent | None:
    s = _series(records, "actor/entropy")
    if len(s) <= cfg.warmup:
        return None
    ref = statistics.fmean(v for _, v in s[: cfg.warmup])
    if not math.isfinite(ref) or ref <= 0:
        return None
    limit = cfg.entropy_collapse_ratio * ref
    n = persisting(s, lambda v: v < limit, cfg.window)
    if n:
        return _event(trial_id, s[-1][0], "entropy_collapse", n, cfg.window,
                      f"entropy {s[-1][1]:.3g} < {cfg.entropy_collapse_ratio:g} x early {ref:.3g}", s[-1][1])
    return None


@register_rule("kl_blowup", kind=INSTABILITY, stages=("learning",))
def kl_blowup(trial_id: str, records: list[StepRecord], cfg: HealthConfig) -> HealthEvent | None:
    s = _series(records, "actor/ppo_kl")
    k = _series(records, "actor/kl_loss")
    for series, name in ((s, "ppo_kl"), (k, "kl_loss")):
        # By magnitude: verl's ppo_kl and its k1 kl_loss are sample means of a log-ratio, which go negative when
        # the policy raises the sampled tokens' probability; a true KL is never negative, so a large negative
        # estimate is as far a move as a large positive one (k2/k3 are never negative and lose nothing here).
        n = persisting(series, lambda v: abs(v) > cfg.kl_max, cfg.window)
        if n:
            return _event(trial_id, series[-1][0], "kl_blowup", n, cfg.window,
                          f"|{name}| {abs(series[-1][1]):.3g} > {cfg.kl_max:g} ({name} {series[-1][1]:.3g})",
                          series[-1][1])
    return None


@register_rule("grad_norm_explosion", kind=INSTABILITY, stages=("learning",))
def grad_norm_explosion(trial_id: str, records: list[StepRecord], cfg: HealthConfig) -> HealthEvent | None:
    s = _series(records, "actor/grad_norm")
    if len(s) <= cfg.warmup:
        return None
    ref = statistics.median(v for _, v in s[: cfg.warmup])
    if not math.isfinite(ref) or ref <= 0:
        return None
    limit = cfg.grad_norm_factor * ref
    n = persisting(s, lambda v: v > limit, cfg.window)
    if n:
        return _event(trial_id, s[-1][0], "grad_norm_explosion", n, cfg.window,
                      f"grad norm {s[-1][1]:.3g} > {cfg.grad_norm_factor:g} x early {ref:.3g}", s[-1][1])
    return None


@register_rule("reward_collapse", kind=INSTABILITY, stages=("learning",))
def reward_collapse(trial_id: str, records: list[StepRecord], cfg: HealthConfig) -> HealthEvent | None:
    s = _series(records, "critic/score/mean")
    if len(s) <= cfg.warmup + 1:
        return None
    best = max(v for _, v in s[: -1])
    if best <= 0:
        return None
    # a collapse is a fall below the best reached before: the low first steps of a rising reward are not one
    fell, top = [], -math.inf
    for step, v in s:
        fell.append((step, float(top > 0 and v < cfg.reward_collapse_ratio * top)))
        top = max(top, v)
    n = persisting(fell, lambda f: f > 0, cfg.window)
    if n:
        return _event(trial_id, s[-1][0], "reward_collapse", n, cfg.window,
                      f"reward {s[-1][1]:.3g} < {cfg.reward_collapse_ratio:g} x best {best:.3g}", s[-1][1])
    return None


# the team's reward only: an agent's shaped reward may plateau by design while the team's improves
@register_rule("reward_stagnation", kind=STAGNATION, stages=("learning",), per_agent=False)
def reward_stagnation(trial_id: str, records: list[StepRecord], cfg: HealthConfig) -> HealthEvent | None:
    s = _series(records, "critic/score/mean")
    if len(s) <= cfg.stagnation_steps:
        return None
    head, tail = s[: -cfg.stagnation_steps], s[-cfg.stagnation_steps:]
    if max(v for _, v in tail) <= max(v for _, v in head):
        return HealthEvent(trial_id=trial_id, step=s[-1][0], rule="reward_stagnation", severity="warn",
                           message=f"no reward improvement in {cfg.stagnation_steps} steps", value=s[-1][1])
    return None


@register_rule("response_clipping", kind=TRUNCATION, stages=("learning",))
def response_clipping(trial_id: str, records: list[StepRecord], cfg: HealthConfig) -> HealthEvent | None:
    s = _series(records, "response_length/clip_ratio")
    if len(s) < 2:
        return None
    rising = s[-1][1] >= s[0][1]
    n = persisting(s, lambda v: v > cfg.clip_ratio_max, cfg.window)
    if n and rising:
        return _event(trial_id, s[-1][0], "response_clipping", n, cfg.window,
                      f"response clip ratio {s[-1][1]:.2f} > {cfg.clip_ratio_max:g} and rising", s[-1][1])
    return None


@register_rule("memory_margin", kind=MEMORY, stages=("system",))
def memory_margin(trial_id: str, records: list[StepRecord], cfg: HealthConfig) -> HealthEvent | None:
    """Stage 1: the measured peak is above (1 - margin) x capacity; such a config is infeasible."""
    if cfg.memory_limit_gb is None:
        return None
    s = _series(records, DEVICE_MEMORY_KEY, *MEMORY_KEYS)  # the device-wide NVML peak when the runner has one
    over = [(step, v) for step, v in s if v > cfg.memory_limit_gb]
    if over:
        step, v = over[-1]
        return HealthEvent(trial_id=trial_id, step=step, rule="memory_margin", severity="stop",
                           message=f"peak memory {v:.3g} GB above the margin limit {cfg.memory_limit_gb:.3g} GB",
                           value=v)
    return None


# --------------------------------------------------------------------------- multi-agent jobs
# A multi-agent trial logs each agent's metrics under ``agent<i>/`` (mart.state.agents). Every rule registered
# ``per_agent`` runs on each agent's stream with the prefix stripped, and the event names the agent
# (``mart.nodes.health_rules.per_agent_events``); the team's metrics (critic/score/mean, val-core/...) go through the
# rules above as before. The team rules below read the whole stream once and name the agents they find.


def agents_text(agents: list[int]) -> str:
    return f"agent {agents[0]} is" if len(agents) == 1 else f"agents {', '.join(map(str, agents))} are"


def _team_stalled_since(records: list[StepRecord], step: int) -> bool:
    """The team's reward has not improved on its best before ``step`` (False without that evidence)."""
    s = _series(records, "critic/score/mean")
    before = [v for st, v in s if st < step and math.isfinite(v)]
    after = [v for st, v in s if st >= step and math.isfinite(v)]
    return bool(before and after) and max(after) <= max(before)


def _pathology(trial_id: str, records: list[StepRecord], cfg: HealthConfig, rule: str, agent: int | None,
               run: list[tuple[int, float]], message: str) -> HealthEvent:
    harmful = len(run) >= cfg.pathology_stop_steps and _team_stalled_since(records, run[0][0])
    why = "; the team's reward has not improved since" if harmful else ""
    return HealthEvent(trial_id=trial_id, step=run[-1][0], rule=rule, severity="stop" if harmful else "warn",
                       message=f"{message} for {len(run)} steps (since step {run[0][0]}){why}", value=run[-1][1],
                       agent=agent)


@register_rule("agent_copying", kind=TEAM, stages=("learning",), team=True)
def agent_copying(trial_id: str, records: list[StepRecord], cfg: HealthConfig) -> list[HealthEvent]:
    """An agent whose answers repeat another agent's, at a high and not falling rate, for ``window`` steps."""
    events = []
    for agent in agents_in_records(records):
        s = _series(records, agent_metric(agent, COPY_RATE))
        run = trailing(s, lambda v: v > cfg.copy_rate_max)
        if len(run) >= cfg.window and s[-1][1] >= s[0][1]:
            events.append(_pathology(trial_id, records, cfg, "agent_copying", agent, run,
                                     f"agent {agent}: copies other agents' answers at rate {run[-1][1]:.2f} > "
                                     f"{cfg.copy_rate_max:g} (from {s[0][1]:.2f} at step {s[0][0]})"))
    return events


@register_rule("reward_concentration", kind=TEAM, stages=("learning",), team=True)
def reward_concentration(trial_id: str, records: list[StepRecord], cfg: HealthConfig) -> list[HealthEvent]:
    """One agent taking nearly all of the team's reward for ``window`` steps (the others learn from ~nothing)."""
    agents = agents_in_records(records)
    if len(agents) < 2:
        return []
    events = []
    for agent in agents:
        run = trailing(_series(records, agent_metric(agent, REWARD_SHARE)), lambda v: v >= cfg.reward_share_max)
        if len(run) >= cfg.window:
            others = [a for a in agents if a != agent]
            events.append(_pathology(trial_id, records, cfg, "reward_concentration", agent, run,
                                     f"agent {agent}: takes {run[-1][1]:.0%} of the team's reward (>= "
                                     f"{cfg.reward_share_max:.0%}; {agents_text(others)} left with the rest)"))
    return events


@register_rule("stale_debate_rounds", kind=TEAM, stages=("learning",), team=True)
def stale_debate_rounds(trial_id: str, records: list[StepRecord], cfg: HealthConfig) -> list[HealthEvent]:
    """Debate rounds after the first change no answer for ``stale_rounds_steps`` steps: the extra rounds cost
    generation and teach nothing. A warning only (agreeing is what a debate converges to)."""
    if cfg.num_rounds is not None and cfg.num_rounds <= 1:
        return []
    run = trailing(_series(records, ANSWER_CHANGE_RATE), lambda v: v <= cfg.answer_change_min)
    if len(run) < cfg.stale_rounds_steps:
        return []
    agreement = _series(records, AGREEMENT)
    agree = f"; agreement {agreement[-1][1]:.2f}" if agreement else ""
    return [HealthEvent(trial_id=trial_id, step=run[-1][0], rule="stale_debate_rounds", severity="warn",
                        message=f"rounds after the first (debate rounds, chain revisions) changed no answer (answer "
                                f"change rate {run[-1][1]:.2f} <= {cfg.answer_change_min:g}) for {len(run)} steps{agree}",
                        value=run[-1][1])]
