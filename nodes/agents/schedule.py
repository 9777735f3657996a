"""Stage 3 (``schedule``) on the agents' side: the diagnosis of a trajectory at a checkpoint, and transitions.

Training is cut into segments; at a segment boundary (a checkpoint) the proposer reads ``diagnose()`` of the
trajectory so far and proposes K *transitions*: coordinated changes of the learning knobs for the next segment,
relative to the parent branch's config (``ctx.base_config``). The rules behind them, each with its public source,
are listed in docs/agents.md ("Stage 3: schedules"):
- LLMZero (arXiv 2606.18388): capacity knobs (rollout n, response length, batch) accumulate across segments;
  regularisation knobs (KL, entropy coefficient, clip ratios, temperature) oscillate with the dynamics.
- Entropy collapse: clip-higher (DAPO, arXiv 2503.14476), an entropy bonus steered toward a target entropy
  (Skywork-OR1's adaptive entropy control, arXiv 2505.22312), a higher sampling temperature (POLARIS).
- Entropy runaway: the same controls turned back (Skywork-OR1's controller lowers the coefficient above target).
- Policy drift (KL, grad norm or clip fraction rising): a KL-to-reference loss and a smaller step.
- Responses truncated at the length limit: a larger budget, in stages (Skywork-OR1 8k -> 16k -> 32k; DeepScaleR
  8k -> 16k -> 24k).

``diagnose`` is pure; ``transition_candidates`` only reads the context.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field
from scipy import stats as _st

from mart.nodes.agents.feedback import parse_feedback
from mart.nodes.stages.capacity import direction as _direction
from mart.nodes.stages.capacity import fmt_value as _fmt
from mart.nodes.stages.capacity import halved_micro_batches, implied_caps, memory_trend, projected_peak
from mart.nodes.stages.capacity import knob_key as _key
from mart.nodes.stages.capacity import knob_spec as _spec
from mart.state.health import INSTABILITY, rule_names
from mart.state.metrics import StepRecord
from mart.state.models import Candidate, config_hash
from mart.state.objectives import LOW_RISK_P_OVER, p_over_limit
from mart.state.stats import LEVEL
from mart.state.trajectory import Trajectory, line_fit, mean, rel_slope, residual_std, tail

if TYPE_CHECKING:
    from mart.nodes.agents.base import AgentContext
    from mart.nodes.agents.feedback import FeedbackRules
    from mart.state.search_space import ParamSpec

# verl metric names (as the local and sim backends emit them)
ENTROPY = "actor/entropy"
KL_KEYS = ("actor/kl_loss", "actor/ppo_kl")
CLIPFRAC = "actor/pg_clipfrac"
GRAD_NORM = "actor/grad_norm"
RESP_LEN = "response_length/mean"
RESP_CLIP = "response_length/clip_ratio"
REWARD_KEYS = ("critic/score/mean", "critic/rewards/mean")
VAL_PREFIX = "val-core/"

# thresholds of the findings (a direction plus a rough size; the sources are in docs/agents.md)
COLLAPSE_RATIO = 0.4
"""Entropy below 40% of its first value: Cui et al. (arXiv 2505.22617) report a ~73% fall early in training,
the pattern clip-higher and entropy control are meant to stop."""
EXPLOSION_RATIO = 1.5
"""Entropy 50% above its first value and rising: the runaway DAPO-style clip-higher can cause over long runs."""
CLIP_RATIO_WARN = 0.05
"""Share of responses cut at the length limit worth a larger budget (DeepScaleR's 8k stage grew 4.2% -> 6.5%
before its 16k stage)."""
CLIP_RISING_MIN = 0.02
"""A smaller clip ratio that is still rising also asks for the next limit (the transitions' trigger, not a
diagnosis finding): DeepScaleR raised 8k -> 16k once responses grew into the limit and the reward dropped."""
KL_ACCELERATION = 2.0
"""Under a KL loss, the KL's relative slope over this multiple of steady growth (one in proportion to the steps,
whose relative slope is 1 / the window's mean step) reads as drift: the anchor is losing hold. A step doubled at
a boundary raises it to ~1.4x over the next segment, which stays below."""
FLAT_SLOPE = 0.002
"""Relative change per step under which a reward or validation curve counts as flat."""
COLLAPSE_BLOCKS = ("collapse",)
CAPACITY_KNOBS = ("rollout.n", "max_response_length", "train_batch_size")
"""LLMZero's capacity knobs: they accumulate across segments (never shrunk by the rules; the critic halves the
score of a transition that shrinks one, except to rescue a collapsing run)."""
"""Pathologies under which adding capacity or exploration is no answer: the run must be stabilised first."""


class Diagnosis(BaseModel):
    """The trajectory so far at a checkpoint (None where the metric is absent)."""

    step: int | None = Field(None, description="global step of the checkpoint")
    entropy: float | None = Field(None, description="actor/entropy at the checkpoint (mean of the last steps)")
    entropy_start: float | None = Field(None, description="actor/entropy at the first step")
    entropy_ratio: float | None = Field(None, description="entropy now / at the first step")
    entropy_slope: float | None = Field(None, description="relative change per step over the last window")
    kl: float | None = Field(None, description="actor/kl_loss (or actor/ppo_kl without a KL loss)")
    kl_slope: float | None = None
    kl_slope_low: float | None = Field(None, description="the lower end of kl_slope's one-sided interval (its "
                                                         "noise over the window): > 0 means it surely rises")
    kl_anchored: bool = Field(False, description="the KL series is the KL loss's own (actor/kl_loss): the run "
                                                 "is anchored to the reference")
    kl_proportional_slope: float | None = Field(
        None, description="the relative slope a KL growing in proportion to the steps since step 0 has over the "
                          "same window (1 / its mean step)")
    peak_memory_gb: float | None = Field(None, description="perf/max_memory_allocated_gb at the checkpoint")
    peak_memory_slope_gb: float | None = Field(None, description="its growth in GB per step over the path")
    pg_clipfrac: float | None = None
    grad_norm: float | None = None
    grad_norm_slope: float | None = None
    grad_norm_slope_low: float | None = None
    grad_norm_ratio: float | None = Field(None, description="grad norm now / at the first steps (their means)")
    response_length: float | None = None
    response_length_slope: float | None = None
    response_clip_ratio: float | None = Field(None, description="share of responses cut at max_response_length")
    response_clip_slope: float | None = Field(None, description="the clip ratio's relative change per step")
    reward: float | None = None
    reward_slope: float | None = None
    reward_best: float | None = Field(None, description="best level of the reward over the trajectory")
    val_score: float | None = None
    val_best: float | None = None
    val_slope: float | None = None
    health_events: list[str] = Field(default_factory=list)
    findings: list[str] = Field(default_factory=list, description="short phrases, most severe first")
    severity: dict[str, float] = Field(default_factory=dict,
                                       description="pathology -> severity in 0..1 (entropy_collapse, entropy_explosion, "
                                                   "length_clipping, policy_drift, instability, plateau, val_decline)")

    def worst(self) -> str | None:
        """The most severe pathology, or None on a healthy trajectory."""
        return max(self.severity, key=self.severity.get) if self.severity else None  # type: ignore[arg-type]


# --------------------------------------------------------------------------- diagnosis


def _r(v: float | None, n: int = 4) -> float | None:
    return None if v is None or not math.isfinite(v) else float(f"{v:.{n}g}")


def diagnose(records: Sequence[StepRecord], health_events: Sequence[str] = (), window: int | None = None) -> Diagnosis:
    """The diagnosis of a trajectory (verl step records, in any order) at its last step.

    ``window``: steps of the last segment that slopes and current levels are measured over (default: the last
    third of the trajectory, at least 3 steps). ``health_events``: the health monitor's rule names or messages.
    """
    traj = Trajectory(records).sorted_by_step()
    recs = traj.records
    events = [str(e) for e in health_events]
    if not recs:
        return Diagnosis(health_events=events)
    span = recs[-1].step - recs[0].step + 1
    w = window if window and window > 0 else max(3, span // 3)
    # levels "now" over a short tail (noise), slopes over the window
    now_w = max(1, min(w, 3))

    def level(pts: list[tuple[int, float]]) -> float | None:
        return mean(tail(pts, now_w)) if pts else None

    def slope(pts: list[tuple[int, float]]) -> float | None:
        return rel_slope(tail(pts, w))

    # one key per metric for the whole trajectory: the first the stream has (kl_loss before ppo_kl)
    ent, kl, clipf = traj.first_series(ENTROPY), traj.first_series(KL_KEYS), traj.first_series(CLIPFRAC)
    gn, rl, rc = traj.first_series(GRAD_NORM), traj.first_series(RESP_LEN), traj.first_series(RESP_CLIP)
    val_key = traj.first_key(VAL_PREFIX)
    rew, val = traj.first_series(REWARD_KEYS), traj.first_series(val_key) if val_key else []
    d = Diagnosis(step=recs[-1].step, health_events=events)
    if ent:
        d.entropy_start = _r(ent[0][1])
        d.entropy = _r(level(ent))
        d.entropy_slope = _r(slope(ent), 3)
        if ent[0][1] > 1e-9 and d.entropy is not None:
            d.entropy_ratio = _r(d.entropy / ent[0][1], 3)
    d.kl, d.kl_slope = _r(level(kl)), _r(slope(kl), 3)
    d.kl_slope_low, d.grad_norm_slope_low = _r(slope_low(tail(kl, w)), 3), _r(slope_low(tail(gn, w)), 3)
    d.kl_anchored = bool(kl) and bool(traj.first_series(KL_KEYS[0]))
    if kl:
        kl_w = tail(kl, w)
        d.kl_proportional_slope = _r(1.0 / max(1.0, line_fit(kl_w)[0]), 3)  # line_fit's first: the mean step
    peak, growth = memory_trend(recs, now_w)
    d.peak_memory_gb, d.peak_memory_slope_gb = _r(peak), _r(growth, 3)
    d.pg_clipfrac = _r(level(clipf))
    d.grad_norm, d.grad_norm_slope = _r(level(gn)), _r(slope(gn), 3)
    if gn:
        first = mean(gn[:now_w])
        if first > 1e-12 and d.grad_norm is not None:
            d.grad_norm_ratio = _r(d.grad_norm / first, 3)
    d.response_length, d.response_length_slope = _r(level(rl)), _r(slope(rl), 3)
    d.response_clip_ratio = _r(level(rc))
    d.response_clip_slope = _r(slope(rc), 3)
    d.reward, d.reward_slope = _r(level(rew)), _r(slope(rew), 3)
    if rew:  # the best smoothed level (a 3-step mean), so one lucky step is not the reference
        d.reward_best = _r(max(mean(rew[max(0, i - now_w + 1): i + 1]) for i in range(len(rew))))
    if val:
        d.val_score = _r(val[-1][1])
        d.val_best = _r(max(v for _, v in val))
        if len(val) >= 3:  # a slope through two noisy points says nothing
            d.val_slope = _r(rel_slope(tail(val, max(w, 3 * (val[-1][0] - val[-2][0])))), 3)
    _find(d)
    return d


def slope_low(pts: list[tuple[int, float]]) -> float | None:
    """The lower end of a series' relative slope (``rel_slope``) at ``stats.LEVEL`` one-sided, from the scatter
    around its line: a per-step metric as noisy as grad norm (+-15% a step) shows a slope of several % per step
    over a few steps by chance. None with fewer than three points."""
    if len(pts) < 3:
        return None
    _, _, sxx, slope = line_fit(pts)
    scale = sum(abs(v) for _, v in pts) / len(pts)
    if sxx == 0 or scale <= 1e-12:
        return None
    se = residual_std(pts) / math.sqrt(sxx)
    return (slope - float(_st.t.ppf(LEVEL, len(pts) - 2)) * se) / scale


Add = Callable[[str, float, str], None]
"""Records one finding: its pathology, its severity (0-1) and its phrase."""


def _find(d: Diagnosis) -> None:
    """Fill ``findings`` and ``severity`` from the measured levels and slopes."""
    found: list[tuple[float, str, str]] = []  # (severity, pathology, phrase)

    def add(name: str, sev: float, phrase: str) -> None:
        sev = max(0.0, min(1.0, sev))
        if sev > d.severity.get(name, 0.0):
            d.severity[name] = round(sev, 3)
        found.append((sev, name, phrase))

    for finder in (_find_entropy, _find_clipping, _find_drift, _find_collapse, _find_instability,
                   _find_val_decline, _find_plateau):  # in this order: a plateau is no decline
        finder(d, add)
    found.sort(key=lambda t: -t[0])
    d.findings = [phrase for _, _, phrase in found]
    if not d.findings:
        d.findings = ["no pathology: entropy, KL, lengths and scores look healthy"]


def entropy_collapsed(d: Diagnosis) -> bool:
    """Entropy below ``COLLAPSE_RATIO`` of its first value, or below 60% and still falling."""
    if d.entropy_ratio is None:
        return False
    falling = d.entropy_slope is not None and d.entropy_slope < -FLAT_SLOPE
    return d.entropy_ratio < COLLAPSE_RATIO or (d.entropy_ratio < 0.6 and falling)


def _find_entropy(d: Diagnosis, add: Add) -> None:
    falling = d.entropy_slope is not None and d.entropy_slope < -FLAT_SLOPE
    rising = d.entropy_slope is not None and d.entropy_slope > FLAT_SLOPE
    if d.entropy_ratio is None or d.step is None:
        return
    fell = 1 - d.entropy_ratio
    if entropy_collapsed(d):
        sev = 0.45 + 0.5 * fell + (0.15 if falling else 0.0)
        add("entropy_collapse", sev, f"entropy fell {fell:.0%} since the first step"
            + (" and is still falling" if falling else ""))
    elif d.entropy_ratio > EXPLOSION_RATIO and rising:
        add("entropy_explosion", 0.4 + 0.3 * min(d.entropy_ratio - 1, 1.5),
            f"entropy rose {d.entropy_ratio - 1:.0%} above its first value and is still rising")


def _find_clipping(d: Diagnosis, add: Add) -> None:
    if d.response_clip_ratio is not None and d.response_clip_ratio >= CLIP_RATIO_WARN:
        growing = (d.response_length_slope or 0) > FLAT_SLOPE
        add("length_clipping", min(0.9, 0.35 + 2.0 * d.response_clip_ratio + (0.1 if growing else 0.0)),
            f"{d.response_clip_ratio:.0%} of responses hit the length limit"
            + (" and responses are still growing" if growing else ""))


def _find_drift(d: Diagnosis, add: Add) -> None:
    drift = []
    # a KL loss's own KL grows as the anchored policy learns (it starts at 0 and the loss bounds it, it does not
    # hold it flat): that growth is drift only when it outpaces growth in proportion to the steps by more than
    # the schedule's own larger step explains (a doubled step from a boundary gives ~1.4x over the next segment;
    # KL_ACCELERATION), i.e. when the anchor no longer holds it
    kl_bar = 0.02 if not d.kl_anchored or d.kl_proportional_slope is None \
        else max(0.02, KL_ACCELERATION * d.kl_proportional_slope)
    # a slope counts by the lower end of its interval where it has one (``slope_low``): noise is no trend
    kl_rise = d.kl_slope if d.kl_slope_low is None else d.kl_slope_low
    gn_rise = d.grad_norm_slope if d.grad_norm_slope_low is None else d.grad_norm_slope_low
    if d.kl_slope is not None and kl_rise is not None and kl_rise > kl_bar and (d.kl or 0) > 1e-3:
        drift.append(f"KL to the reference rising {d.kl_slope:.1%}/step"
                     + (f" under its KL loss ({d.kl_slope / d.kl_proportional_slope:.1f}x steady growth)"
                        if d.kl_anchored and d.kl_proportional_slope else ""))
    if d.grad_norm_slope is not None and gn_rise is not None and gn_rise > 0.02 and not collapse_explains_grad_norm(d):
        drift.append(f"grad norm rising {d.grad_norm_slope:.1%}/step")
    if d.pg_clipfrac is not None and d.pg_clipfrac > 0.2:
        drift.append(f"{d.pg_clipfrac:.0%} of tokens clipped")
    # KL and grad norm grow while a policy learns (KL starts at 0): they count as drift only when the reward
    # does not rise with them; a large clipped share is drift on its own
    gaining = d.reward_slope is not None and d.reward_slope > FLAT_SLOPE
    heavy_clip = d.pg_clipfrac is not None and d.pg_clipfrac > 0.2
    if drift and (heavy_clip or not gaining):
        add("policy_drift", 0.3 + 0.2 * len(drift), "the policy drifts: " + ", ".join(drift)
            + ("" if gaining else " without a reward gain"))


def collapse_explains_grad_norm(d: Diagnosis) -> bool:
    """A grad norm rise that the entropy collapse beside it explains: entropy down to the collapse finding's level
    (``_find_entropy``) and the grad norm up since the first steps by no more than the entropy's fall (a sharper
    policy's log-probabilities have larger gradients: the rise follows 1 / the entropy ratio at most). Such a
    rise is the collapse's symptom, answered by the entropy controls; read as drift it halves the step, which
    slows learning without touching the collapse. A rise beyond that factor, or a KL rise or heavy clipping beside
    it, is still drift."""
    if d.entropy_ratio is None or d.grad_norm_ratio is None or d.entropy_ratio <= 0:
        return False
    return entropy_collapsed(d) and d.grad_norm_ratio <= 1.0 / d.entropy_ratio


def _find_collapse(d: Diagnosis, add: Add) -> None:
    """The reward falling fast well below its best, or validation far below its best."""
    rew_fall = (d.reward is not None and d.reward_best and d.reward < 0.7 * d.reward_best
                and (d.reward_slope or 0) < -0.01)
    val_fall = (d.val_score is not None and d.val_best and d.val_score < 0.7 * d.val_best)
    if rew_fall or val_fall or any("reward_collapse" in e for e in d.health_events):
        what = (f"the reward fell from {d.reward_best:.3g} to {d.reward:.3g}" if rew_fall
                else f"validation fell from {d.val_best:.3g} to {d.val_score:.3g}" if val_fall
                else "the health monitor saw a reward collapse")
        add("collapse", 1.0, f"training collapses: {what}")


def _find_instability(d: Diagnosis, add: Add) -> None:
    bad = sorted({e for e in d.health_events for rule in rule_names(INSTABILITY) if rule in e})
    if bad:
        add("instability", 0.9, "health events: " + ", ".join(bad))


def _find_val_decline(d: Diagnosis, add: Add) -> None:
    if d.val_score is not None and d.val_best is not None and d.val_best > 0 \
            and d.val_score < d.val_best * 0.95 and (d.val_slope or 0) < 0:
        add("val_decline", 0.5 + min(0.4, (d.val_best - d.val_score) / d.val_best),
            f"validation fell from its best {d.val_best:.3g} to {d.val_score:.3g}")


def _find_plateau(d: Diagnosis, add: Add) -> None:
    flat_val = d.val_slope is not None and abs(d.val_slope) < FLAT_SLOPE
    flat_rew = d.reward_slope is not None and abs(d.reward_slope) < FLAT_SLOPE
    if (flat_val or (d.val_slope is None and flat_rew)) and "val_decline" not in d.severity:
        add("plateau", 0.3, "validation has stopped improving" if flat_val else "reward has stopped improving")


# --------------------------------------------------------------------------- transitions


# the schedule stage's traits (``mart.state.stages``): it moves the learning knobs and the system knobs a
# capacity change implies (``ParamSpec.schedule``: the token caps that must hold the longest sequence once
# ``data.max_response_length`` grows; ``SearchSpace.stage_params("schedule")``)


# Skywork-OR1's adaptive entropy control (or1_scripts/train/7b_8k.sh): target entropy 0.2, coefficient stepped by
# 1e-4 per step between 0 and 0.005. mart applies it per segment: the coefficient moves by the step x the
# segment's length, within the same cap.
ENT_COEF_STEP = 1e-4
ENT_COEF_MAX = 0.005
DEFAULT_SEGMENT = 10
"""Segment length assumed when the context does not say (steps)."""


@dataclass
class Move:
    """One knob's change inside a transition."""

    suffix: str
    how: str
    """``x2``, ``/2``, ``+0.1``, ``atleast:0.28``, ``atmost:0.2``, ``on``, ``off``, ``ent+``/``ent-`` (Skywork-OR1's
    entropy controller over one segment), ``temp+`` (POLARIS: +0.05 after a slight entropy fall, +0.1 after a
    large one), ``stage+`` (DeepScaleR's staged response limit: the schedule's start limit added), ``step+`` (twice the
    schedule's starting learning rate, once)."""


@dataclass
class Rule:
    """A transition template: the findings it answers, coordinated knob moves, the public source."""

    name: str
    answers: tuple[str, ...]
    """Pathologies it answers; ``healthy`` = offered on every trajectory (capacity, relaxing regularisation)."""
    moves: list[Move]
    why: str
    prior: float
    family: str
    """Candidates of one family test the same hypothesis: K transitions cover distinct families first."""
    blocked_by: tuple[str, ...] = ()
    """Not offered while one of these pathologies is present."""
    led: bool = False
    """The moves after the first only go with it (the KL anchor of a larger step): no first move, no rule."""
    bundle_only: bool = False
    """Only a part of a coordinated transition, never a branch of its own."""
    needs: Callable[[Diagnosis], bool] | None = None
    """What the diagnosis must show besides the pathologies it answers."""


RULES: list[Rule] = [
    # entropy collapse: three independent controls (regularisation knobs: they oscillate with the dynamics)
    Rule("clip-higher", ("entropy_collapse",), [Move("clip_ratio_high", "atleast:0.28")],
         "clip-higher lets low-probability tokens grow and keeps entropy up (DAPO, arXiv 2503.14476, "
         "clip_ratio_high 0.28)", 0.9, "clip"),
    Rule("adaptive-entropy", ("entropy_collapse",),
         [Move("entropy_coeff", "ent+"), Move("rollout.temperature", "atleast:1.0")],
         "entropy below target: raise the entropy bonus as Skywork-OR1's adaptive entropy control does "
         "(arXiv 2505.22312: +1e-4 per step, at most 0.005), sampling at temperature >= 1.0 as it does",
         0.8, "entropy", blocked_by=("instability", "collapse")),
    Rule("hotter-sampling", ("entropy_collapse",),
         [Move("rollout.temperature", "temp+"), Move("clip_ratio_high", "atleast:0.28")],
         "diversity collapsed: raise the sampling temperature, more after a larger entropy fall, with "
         "clip-higher (POLARIS raises the temperature across stages by the previous stage's entropy drop)",
         0.7, "temperature", blocked_by=("collapse",)),
    # entropy runaway: the same controls turned back
    Rule("entropy-brake", ("entropy_explosion",),
         [Move("entropy_coeff", "ent-"), Move("clip_ratio_high", "atmost:0.28")],
         "entropy runs away: lower the entropy bonus (Skywork-OR1's controller lowers it above target; POLARIS "
         "drops the entropy loss because it can grow uncontrollably) and cap clip-higher at DAPO's 0.28",
         0.85, "entropy"),
    Rule("cooler-sampling", ("entropy_explosion",),
         [Move("rollout.temperature", "-0.05"), Move("clip_ratio_high", "atmost:0.2")],
         "entropy runs away: sample cooler and close clip-higher (regularisation oscillates, LLMZero)",
         0.6, "temperature"),
    # responses cut at the limit: capacity, raised in stages
    Rule("longer-budget", ("length_clipping",), [Move("max_response_length", "stage+")],
         "responses hit the length limit: raise the budget to the next stage, as DeepScaleR does (8k -> 16k -> "
         "24k: the start limit added per stage; Skywork-OR1: 8k -> 16k -> 32k), with the token caps it implies",
         0.9, "length",
         blocked_by=("collapse", "entropy_explosion")),  # runaway lengths are then a symptom
    Rule("staged-budget", ("healthy",), [Move("max_response_length", "stage+")],
         "capacity grows across stages (LLMZero, arXiv 2606.18388) and some responses already reach the limit: "
         "the budget's next stage goes with the other moves (DeepScaleR's staged limits), before the cut share "
         "grows", 0.3, "length", blocked_by=("collapse", "entropy_explosion"), bundle_only=True,
         needs=lambda d: (d.response_clip_ratio or 0) > 0),
    # the policy drifts from the reference, or the run is unstable
    Rule("rescue", ("collapse",),
         [Move("optim.lr", "/2"), Move("use_kl_loss", "on"), Move("entropy_coeff", "ent-"),
          Move("clip_ratio_high", "atmost:0.28")],
         "training collapses: a smaller step anchored to the reference, without the exploration pushes (a "
         "too-large lr collapses GRPO runs: 50x takes Qwen3-0.6B on GSM8K from 57% to 2.4%)", 0.95, "rescue"),
    Rule("kl-anchor", ("policy_drift", "instability", "collapse"),
         [Move("use_kl_loss", "on"), Move("kl_loss_coef", "x2")],
         "the policy drifts: anchor it to the reference with a KL loss, doubling the coefficient when it is "
         "on (PPO's adaptive KL penalty doubles it when KL exceeds 1.5x its target, arXiv 1707.06347)",
         0.8, "kl"),
    Rule("smaller-step", ("policy_drift", "instability", "val_decline", "collapse"),
         [Move("optim.lr", "/2"), Move("clip_ratio_high", "atmost:0.28")],
         "halve the learning rate (too large a step collapses GRPO runs; verl uses 1e-6..1e-5) and cap "
         "clip-higher at DAPO's 0.28", 0.75, "lr"),
    # the step size: raised once per schedule (twice the start's lr at most), inside a KL anchor
    Rule("larger-step", ("healthy", "plateau"), [Move("optim.lr", "step+"), Move("use_kl_loss", "on")],
         "a healthy run learns no faster than its step allows: double the schedule's starting learning rate "
         "once, anchored to the reference by a KL loss (PPO's trust region, arXiv 1707.06347; verl's "
         "kl_loss_coef 0.001), so the larger step cannot drift far; evidence from the branch decides whether it "
         "stays", 0.55, "step", blocked_by=("collapse", "policy_drift", "instability", "val_decline",
                                            "entropy_explosion"), led=True),
    Rule("anneal", ("plateau",), [Move("optim.lr", "/2")],
         "validation stopped improving: lower the learning rate (the classic reduce-on-plateau schedule)",
         0.45, "lr"),
    # capacity accumulates on any trajectory (LLMZero)
    Rule("more-rollouts", ("healthy", "plateau"), [Move("rollout.n", "x2")],
         "capacity accumulates across segments (LLMZero, arXiv 2606.18388): more samples per prompt for the "
         "next segment, a better group baseline", 0.5, "capacity", blocked_by=COLLAPSE_BLOCKS),
    Rule("bigger-batch", ("healthy", "plateau"),
         [Move("train_batch_size", "x2"), Move("ppo_mini_batch_size", "x2")],
         "capacity accumulates across segments (LLMZero): twice the prompts per step, the same updates per step",
         0.4, "capacity", blocked_by=COLLAPSE_BLOCKS),
    Rule("early-clip-higher", ("healthy",), [Move("clip_ratio_high", "atleast:0.28")],
         "entropy falls fastest early in RL training (Cui et al., arXiv 2505.22617): DAPO keeps clip-higher on "
         "from the start to prevent the collapse rather than cure it", 0.3, "clip",
         blocked_by=("collapse", "entropy_explosion")),
    Rule("step-decay", ("healthy",), [Move("optim.lr", "/2")],
         "a later segment with a smaller step: the classic step-decay schedule, consolidating what was learnt",
         0.2, "lr", blocked_by=("entropy_explosion",)),
    Rule("relax", ("healthy",), [Move("entropy_coeff", "ent-"), Move("kl_loss_coef", "/2")],
         "regularisation oscillates with the dynamics (LLMZero): with the trajectory healthy, relax the entropy "
         "bonus and the KL anchor (PPO halves the KL coefficient when KL is under its target)", 0.3, "relax",
         blocked_by=("entropy_collapse", "policy_drift", "instability", "collapse")),
]


@dataclass
class _Info:
    """What the moves need to know about the segment and the trajectory."""

    segment_steps: int = DEFAULT_SEGMENT
    entropy_ratio: float | None = None
    start_limit: float | None = None
    """The schedule's first response limit (its root's): each stage of the staged budget adds it."""
    start_lr: float | None = None
    """The schedule's first learning rate (its root's): ``step+`` raises the step to twice it, once."""


def _apply_move(spec: ParamSpec, value: Any, how: str, info: _Info) -> Any:
    """The new value of a knob (clamped to its range), or ``value`` itself when the move cannot apply."""
    if spec.kind == "bool":
        return how == "on" if how in ("on", "off") else value
    if spec.kind == "categorical" or spec.low is None or spec.high is None:
        return value
    v = float(value if value is not None else spec.default if spec.default is not None else spec.low)
    ent_step = ENT_COEF_STEP * info.segment_steps
    if how.startswith("atleast:"):  # raise to a published value, never lower
        nv = max(v, float(how.split(":")[1]))
    elif how.startswith("atmost:"):
        nv = min(v, float(how.split(":")[1]))
    elif how == "x2":  # from zero, the knob's default (verl's kl_loss_coef 0.001)
        nv = v * 2 if v > 0 else float(spec.default or 0)
    elif how == "/2":
        nv = v / 2
    elif how == "ent+":
        nv = v if v >= ENT_COEF_MAX else min(ENT_COEF_MAX, v + ent_step)
    elif how == "ent-":
        nv = max(0.0, v - ent_step)
    elif how == "stage+":  # DeepScaleR's staged budget: the start limit added per stage (the first stage doubles)
        nv = v + (info.start_limit if info.start_limit and info.start_limit > 0 else v)
    elif how == "step+":  # twice the schedule's starting step, once: a path already above it keeps its step
        if not info.start_lr or v > info.start_lr * (1 + 1e-6):
            return value
        nv = 2 * info.start_lr
    elif how == "temp+":
        slight = info.entropy_ratio is not None and info.entropy_ratio >= 0.6
        nv = v + (0.05 if slight else 0.1)
    elif how[0] in "+-":
        nv = v + float(how)
    else:
        return value
    nv = min(spec.high, max(spec.low, nv))
    nv = int(round(nv)) if spec.kind == "int" else float(f"{nv:.4g}")
    return spec.validate(nv)


def severities(ctx: AgentContext) -> dict[str, float]:
    """Pathology -> severity for this context: the diagnosis, the health monitor's events, and the length
    budget read against the parent's config; ``healthy`` always (capacity moves are always on offer)."""
    d = ctx.diagnosis
    sev = dict(d.severity) if d is not None else {}
    # in stage 3 the diagnosis holds the events of the branch's own path; the context's are the session's
    texts = list(d.health_events) if ctx.traits.branches and d is not None else [
        e.rule for e in ctx.health_events]

    def seen(rule: str) -> bool:
        return any(rule in t for t in texts)

    if any(seen(r) for r in rule_names(INSTABILITY)):
        sev["instability"] = max(sev.get("instability", 0.0), 0.9)
    if seen("entropy_collapse"):
        sev["entropy_collapse"] = max(sev.get("entropy_collapse", 0.0), 0.7)
    if seen("response_clipping"):
        sev["length_clipping"] = max(sev.get("length_clipping", 0.0), 0.6)
    if d is not None and d.response_clip_ratio is not None and d.response_clip_ratio >= CLIP_RISING_MIN \
            and (d.response_clip_slope or 0) > FLAT_SLOPE:  # the clip ratio rising: the next limit is due
        sev["length_clipping"] = max(sev.get("length_clipping", 0.0), min(0.8, 0.4 + 2.0 * d.response_clip_ratio))
    limit_key = _key(ctx, "max_response_length")
    if d is not None and d.response_length and limit_key:
        limit = ctx.base_config.get(limit_key)
        if isinstance(limit, (int, float)) and limit > 0 and d.response_length > 0.6 * limit \
                and (d.response_length_slope or 0) > FLAT_SLOPE:
            sev["length_clipping"] = max(sev.get("length_clipping", 0.0), 0.4)  # growing toward the limit
    sev["healthy"] = 0.25
    return sev


def _build(ctx: AgentContext, rule: Rule, start: dict[str, Any], fb: FeedbackRules,
           info: _Info) -> tuple[dict[str, Any], list[str]] | None:
    """The overrides of one rule applied to ``start``, following the feedback; None when nothing moves."""
    current = ctx.full_config(start)
    overrides = dict(start)
    moved: list[str] = []
    kl_key = _key(ctx, "use_kl_loss")
    kl_was_on = bool(current.get(kl_key, False)) if kl_key else True
    led = False  # the rule's first move applied
    for mv in rule.moves:
        spec = _spec(ctx, mv.suffix)
        if spec is None:
            continue
        if mv.suffix == "kl_loss_coef" and not kl_was_on:
            continue  # turning the KL loss on is the move; its coefficient changes nothing while it is off
        old = current.get(spec.key, spec.default)
        try:
            new = _apply_move(spec, old, mv.how, info)
        except (ValueError, TypeError):
            continue
        direction = _direction(old, new)
        if direction is None or not fb.allows(spec.key, direction):
            continue
        overrides[spec.key] = new
        moved.append(f"{spec.key.rsplit('.', 1)[-1]} {_fmt(old)}->{_fmt(new)}")
        led = led or mv is rule.moves[0]
    if not moved or (rule.led and not led):
        return None
    for k in list(overrides):  # a value equal to the base is no override
        if k not in start and ctx.base_config.get(k, _MISSING) == overrides[k]:
            overrides.pop(k)
    return overrides, moved


_MISSING = object()


def _peak(ctx: AgentContext, full: dict[str, Any]) -> float | None:
    pred = ctx.predict(full)
    if pred is not None and getattr(pred, "peak_gb", None) is not None:
        return float(pred.peak_gb)
    try:
        value = ctx.predict_memory(full)
    except Exception:  # noqa: BLE001 - a failing memory model must not cost the round
        return None
    return None if value is None else float(value)


@dataclass
class _Option:
    score: float
    family: str
    capacity: bool
    cand: Candidate
    answer: str = "healthy"
    bundle_only: bool = False


def memory_safe(ctx: AgentContext, overrides: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``overrides`` with the micro batches (``ParamSpec.memory_safe``) halved when the path's peak memory,
    projected to the schedule's end, passes the memory limit, and the moves as text. The projection
    (``capacity.projected_peak``): the peak at the checkpoint plus its measured growth per step
    (``capacity.memory_trend``: responses lengthen as the policy learns) over the steps left, that growth scaled
    by the transition's step-size ratio (a doubled lr doubles it, a halved one halves it). A micro batch changes
    no update's math (gradients accumulate to the same mini batch), so the transition's learning is what it was;
    it costs some throughput. Halved once per transition: the stage re-projects every continuation at each later
    boundary, unchanged ones included, and halves again if the projection still passes the limit."""
    d = ctx.diagnosis
    if d is None or d.peak_memory_gb is None or not ctx.memory_limit_gb or not ctx.horizon or not ctx.segment:
        return overrides, []
    full, parent = ctx.full_config(overrides), ctx.full_config({})
    speed = 1.0
    lr_key = _key(ctx, "optim.lr")
    if lr_key:
        old, new = parent.get(lr_key), full.get(lr_key)
        if isinstance(old, (int, float)) and isinstance(new, (int, float)) and old > 0:
            speed = float(new) / float(old)
    projected = projected_peak(d.peak_memory_gb, d.peak_memory_slope_gb, ctx.horizon - ctx.segment[0], speed)
    if projected <= ctx.memory_limit_gb:
        return overrides, []
    halved, moved = halved_micro_batches(ctx.search_space.stage_params(ctx.stage), full, ctx.config_errors)
    if not moved:
        return overrides, []
    return {**overrides, **halved}, [
        f"peak memory {d.peak_memory_gb:.1f} GB growing {d.peak_memory_slope_gb or 0.0:.2f} GB/step, "
        f"projected {projected:.1f} GB at step {ctx.horizon} against a limit of "
        f"{ctx.memory_limit_gb:.1f} GB: " + ", ".join(moved)]


def memory_risk_safe(ctx: AgentContext, overrides: dict[str, Any], parent_peak: float | None
                     ) -> tuple[dict[str, Any], list[str]]:
    """``overrides`` with the micro batches halved when the job model's predicted peak of the transition adds
    memory over its parent's and passes the limit with more than ``LOW_RISK_P_OVER`` chance (the critic's
    "risk" of a candidate, which weighs its score down), and halving lowers that chance; the moves as text. A
    larger response limit's new tail is priced at the limit itself (docs/agents.md), so a bundle with it is
    predicted near the limit while its parts are not: it lost the critic's pick to the same bundle without the
    limit on one noisy measurement of risk, although a micro batch changes no learning."""
    limit = ctx.memory_limit_gb
    pred = ctx.predict(ctx.full_config(overrides))
    if not limit or pred is None or getattr(pred, "peak_gb", None) is None \
            or (parent_peak is not None and pred.peak_gb <= parent_peak):
        return overrides, []
    p_over = p_over_limit(pred.peak_gb, pred.gap_gb, limit)
    if p_over <= LOW_RISK_P_OVER:
        return overrides, []
    full = ctx.full_config(overrides)
    halved, moved = halved_micro_batches(ctx.search_space.stage_params(ctx.stage), full, ctx.config_errors)
    after = ctx.predict({**full, **halved}) if moved else None
    if after is None or p_over_limit(after.peak_gb, after.gap_gb, limit) >= p_over:
        return overrides, []
    return {**overrides, **halved}, [f"predicted peak {pred.peak_gb:.1f} GB against a limit of {limit:.1f} GB, "
                                     f"{p_over:.0%} likely over it: " + ", ".join(moved)]


def transition_candidates(ctx: AgentContext) -> list[Candidate]:
    """``ctx.num_candidates`` transitions for the next segment, most severe finding first, over distinct
    hypotheses, with a capacity move among them (alone or with the top answer) whenever one fits."""

    fb = parse_feedback(ctx.feedback, ctx.search_space)
    diag = ctx.diagnosis
    sev = severities(ctx)
    info = _Info(segment_steps=(ctx.segment[1] - ctx.segment[0]) if ctx.segment and ctx.segment[1] > ctx.segment[0]
                 else DEFAULT_SEGMENT, entropy_ratio=diag.entropy_ratio if diag else None,
                 start_limit=start_limit(ctx), start_lr=start_value(ctx, "optim.lr"))
    start: dict[str, Any] = {}  # transitions are changes of the parent branch's config (ctx.base_config)
    parent = ctx.full_config(start)
    # the parent's own config continuing is no transition (the stage runs it, or not, by itself)
    tried = ctx.tried_keys() | {config_hash(parent)}
    parent_peak = _peak(ctx, parent)
    seg = f" for steps {ctx.segment[0]}-{ctx.segment[1]}" if ctx.segment else ""

    def make(overrides: dict[str, Any], score: float, rationale: str) -> Candidate | None:
        overrides, caps = implied_caps(ctx, overrides)
        if caps:
            rationale += f" The token caps it implies follow: {', '.join(caps)}."
        overrides, safe = memory_safe(ctx, overrides)
        if not safe:
            overrides, safe = memory_risk_safe(ctx, overrides, parent_peak)
        if safe:
            rationale += f" Smaller micro batches keep it in memory to the end ({safe[0]})."
        full = ctx.full_config(overrides)
        if config_hash(full) in tried or ctx.config_errors(overrides):
            return None
        peak = _peak(ctx, full)
        if peak is not None and ctx.memory_limit_gb and peak > ctx.memory_limit_gb \
                and (parent_peak is None or peak > parent_peak):
            return None  # more memory than the limit allows (a longer budget or more rollouts)
        return Candidate(candidate_id="", stage=ctx.stage, overrides=overrides, source="rules",
                         rationale=rationale, predicted_memory_gb=peak, expected_gain=round(score, 4))

    options: list[_Option] = []
    for rule in RULES:
        present = [a for a in rule.answers if a in sev]
        if not present or any(b in sev for b in rule.blocked_by) \
                or (rule.needs is not None and (diag is None or not rule.needs(diag))):
            continue
        answer = max(present, key=lambda a: sev[a])
        built = _build(ctx, rule, start, fb, info)
        if built is None:
            continue
        overrides, moved = built
        if rule.led and len(moved) > 1 and make(dict(overrides), 0.0, "") is None:
            # the companions do not fit (a KL anchor's reference model over the memory limit): the lead move alone
            lead = _spec(ctx, rule.moves[0].suffix)
            if lead is not None and lead.key in overrides:
                overrides = {**start, lead.key: overrides[lead.key]}
                moved = moved[:1]
        score = sev[answer] * rule.prior
        focus = [k for k in overrides if k in fb.focus and k not in start]
        if focus:
            score = score * 2 + 0.5
        rationale = f"{_finding_for(diag, answer)} -> {', '.join(moved)}{seg}: {rule.why}."
        if focus:
            rationale += " The reviewer asked for this change."
        cand = make(overrides, score, rationale)
        if cand is not None:
            options.append(_Option(score, rule.family, rule.family == "capacity", cand, answer, rule.bundle_only))
    moved_keys = {k for o in options for k in o.cand.overrides if k not in start}
    for key in sorted(fb.focus - moved_keys):  # the reviewer asked for a knob no rule moves here
        opt = _requested(ctx, key, start, fb, info, make, seg)
        if opt is not None:
            options.append(opt)
    options.sort(key=lambda o: -o.score)
    safe_keys = {p.key for p in ctx.search_space.stage_params(ctx.stage) if p.memory_safe}
    coordinated = _coordinated(options, start, make, safe_keys)
    picked = [o.cand for o in coordinated[:ctx.num_candidates]]
    keys = {c.key() for c in picked}
    rest = [o for o in options if o.cand.key() not in keys and not o.bundle_only]
    return picked + _diverse(rest, ctx.num_candidates - len(picked))


def start_limit(ctx: AgentContext) -> float | None:
    """The response limit the schedule started with (its root segment's), else None (the stage's first round)."""
    return start_value(ctx, "max_response_length")


def start_value(ctx: AgentContext, suffix: str) -> float | None:
    """A numeric knob's value in the schedule's root segment (the start config), else None (the stage's first
    round)."""
    key = _key(ctx, suffix)
    if key is None:
        return None
    roots = [t for t in ctx.history if t.stage == ctx.stage and t.parent_trial is None and not t.confirms]
    value = roots[0].config.get(key) if roots else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _requested(ctx: AgentContext, key: str, start: dict[str, Any], fb: FeedbackRules, info: _Info, make: Any,
               seg: str) -> _Option | None:
    """A transition moving a knob the reviewer named, the way they asked (or up, then down)."""
    if key not in ctx.search_space or not ctx.search_space[key].in_stage(ctx.stage) \
            or ctx.search_space[key].stage == "system":  # a token cap moves only with the limit it follows
        return None
    spec = ctx.search_space[key]
    old = ctx.full_config(start).get(key, spec.default)
    if spec.kind == "categorical":  # the next choice, then the previous one
        choices = list(spec.choices or ())
        i = choices.index(old) if old in choices else -1
        for new in [c for c in (choices[(i + 1) % len(choices)], choices[i - 1]) if c != old][:2]:
            cand = make({**start, key: new}, 1.0, f"The reviewer asked for {ctx.search_space.edit_name(key)} -> "
                                                  f"{key.rsplit('.', 1)[-1]} {_fmt(old)}->{_fmt(new)}{seg}.")
            if cand is not None:
                return _Option(1.0, "reviewer", False, cand, "reviewer")
        return None
    if spec.kind == "bool":
        hows = ["off" if old else "on"]
    elif spec.kind in ("int", "log"):
        hows = ["x2", "/2"]
    else:
        step = ((spec.high or 0) - (spec.low or 0)) / 10
        hows = [f"+{step:.4g}", f"-{step:.4g}"]
    for how in hows:
        try:
            new = _apply_move(spec, old, how, info)
        except (ValueError, TypeError):
            continue
        direction = _direction(old, new)
        if direction is None or not fb.allows(key, direction):
            continue
        overrides = {**start, key: new}
        name = key.rsplit(".", 1)[-1]
        cand = make(overrides, 1.0, f"The reviewer asked for {ctx.search_space.edit_name(key)} -> {name} "
                                    f"{_fmt(old)}->{_fmt(new)}{seg}.")
        if cand is not None:
            return _Option(1.0, "reviewer", False, cand, "reviewer")
    return None


#: families of capacity moves: a coordinated transition takes one of them (the cost of a step grows with each)
CAPACITY_FAMILIES = ("capacity", "length")


def _coordinated(options: list[_Option], start: dict[str, Any], make: Any,
                 safe_keys: set[str] | frozenset[str] = frozenset()) -> list[_Option]:
    """LLMZero's coordinated transitions (arXiv 2606.18388): the best option of each family that answers a
    finding of the diagnosis, merged into one transition - regularisation towards what the trajectory needs, one
    capacity move when a finding asks for it (clipped responses), the step size - then the same without the
    step-size move (so the branches from a checkpoint test the larger
    step against the same moves without it), then without the capacity move. Knob by knob the option with the higher score wins; none when fewer
    than two families answer.

    Why: each knob alone moves the final score by about one measurement's noise, so single-knob branches are
    lost in it, while the moves together are worth several times the noise (docs/runtime.md, the schedule
    stage's diagnosis). The parts' memory-safe micro batches (``safe_keys``) are left out of the merge:
    ``make`` projects the merged transition's memory itself."""
    merged: dict[str, Any] = {}
    parts: list[_Option] = []
    fams: set[str] = set()
    for o in options:  # sorted by score: each family's first option is its best
        if o.family in fams or o.family == "reviewer" or (
                o.family in CAPACITY_FAMILIES and fams & set(CAPACITY_FAMILIES)):
            continue
        if o.answer in ("healthy", "plateau") and o.family not in ("step", "length"):
            continue  # a healthy run's rollouts, regularisation and step-decay ideas stay single branches: the
            # bundle answers findings, raises the step once and takes the response limit's next stage once some
            # responses reach it (LLMZero: capacity grows across stages; a limit costs no step time until
            # responses use it, and the bundle's memory is projected to the end, ``memory_safe``); more rollouts
            # "because healthy" doubled the memory of runs whose responses were still growing, and their
            # continuations ran out of memory
        extra = {k: v for k, v in o.cand.overrides.items() if k not in start and k not in safe_keys}
        if set(extra) & set(merged):
            continue
        fams.add(o.family)
        merged.update(extra)
        parts.append(o)
    out: list[_Option] = []
    # the whole, then without the larger step, then without the capacity move (a longer limit predicted near the
    # memory limit must not sink the rest: the critic weighs a candidate by its memory risk)
    for without in (None, "step", CAPACITY_FAMILIES):
        use = [o for o in parts if not (o.family == without or (isinstance(without, tuple) and o.family in without))]
        if len(use) < 2 or (without and len(use) == len(parts)) \
                or all(o.answer in ("healthy", "plateau") for o in use):  # a bundle answers a finding
            continue
        over = dict(start)
        for o in use:
            over.update({k: v for k, v in o.cand.overrides.items() if k not in safe_keys})
        score = sum(o.score for o in use)
        head = "Coordinated transition (LLMZero: regularisation follows the dynamics, capacity accumulates" + (
            ", the step grows once" if any(o.family == "step" for o in use) else "") + "): "
        cand = make(over, score, head + " + ".join(o.cand.rationale.split(" The token caps")[0] for o in use))
        if cand is not None:
            out.append(_Option(score, "coordinated", any(o.capacity for o in use), cand, use[0].answer))
    return out


def _diverse(options: list[_Option], k: int) -> list[Candidate]:
    """Up to ``k`` candidates, never two with the same config: the best answer to each finding (most severe
    first), a capacity move when ``k >= 3``, then one per untried family, then the rest by score."""
    if k <= 0:
        return []
    picked: list[_Option] = []
    keys: set[str] = set()

    def take(o: _Option) -> None:
        picked.append(o)
        keys.add(o.cand.key())

    answers: set[str] = set()
    for o in options:  # sorted by score: the first option of each answer is its best
        if len(picked) < k and o.answer not in answers and o.answer != "healthy" and o.cand.key() not in keys:
            answers.add(o.answer)
            take(o)
    if k >= 3 and not any(o.capacity for o in picked):
        cap = next((o for o in options if o.capacity and o.cand.key() not in keys), None)
        if cap is not None:
            if len(picked) >= k:
                dropped = picked.pop()
                keys.discard(dropped.cand.key())
            take(cap)
    fams = {o.family for o in picked}
    for o in options:
        if len(picked) < k and o.family not in fams and o.cand.key() not in keys:
            fams.add(o.family)
            take(o)
    for o in options:
        if len(picked) >= k:
            break
        if o.cand.key() not in keys:
            take(o)
    picked.sort(key=lambda o: -o.score)
    return [o.cand for o in picked[:k]]


def _finding_for(diag: Diagnosis | None, pathology: str) -> str:
    if pathology == "healthy":
        return "Healthy trajectory" if diag is None or not diag.severity else "Beside the findings"
    if diag is not None:
        for phrase in diag.findings:
            if _PHRASE_OF.get(pathology, "@") in phrase:
                return phrase[0].upper() + phrase[1:]
        if pathology == "length_clipping" and diag.response_clip_ratio is not None:
            return f"{diag.response_clip_ratio:.1%} of responses hit the length limit and the share is rising"
    return pathology.replace("_", " ").capitalize()


_PHRASE_OF = {"collapse": "collapses", "entropy_collapse": "entropy fell", "entropy_explosion": "entropy rose",
              "length_clipping": "length limit", "policy_drift": "drifts", "instability": "health events",
              "val_decline": "validation fell", "plateau": "stopped improving"}


def _best_answer(ctx: AgentContext, overrides: dict[str, Any], sev: dict[str, float]) -> tuple[float, str | None, str | None]:
    """(score, pathology, phrase) of the finding ``overrides`` answers best (see ``transition_score``)."""
    best, answer, phrase, _ = _answers(ctx, overrides, sev)
    return best, answer, phrase


def _answers(ctx: AgentContext, overrides: dict[str, Any], sev: dict[str, float]
             ) -> tuple[float, str | None, str | None, set[str]]:
    """``_best_answer``'s figures and the findings ``overrides`` answers (a coordinated transition answers
    several; ``healthy`` counts as one)."""
    info = _Info(entropy_ratio=ctx.diagnosis.entropy_ratio if ctx.diagnosis else None, start_limit=start_limit(ctx),
                 start_lr=start_value(ctx, "optim.lr"))
    parent = dict(ctx.base_config)
    new = ctx.full_config(overrides)
    moved = {k: d for k, v in new.items() if (d := _direction(parent.get(k), v)) is not None}
    best, answer_of, answered = 0.05, None, None
    hit: list[tuple[str, str]] = []  # (finding, rule family) of each rule the transition follows
    for rule in RULES:
        present = [a for a in rule.answers if a in sev]
        if not present or any(b in sev for b in rule.blocked_by) \
                or (rule.needs is not None and (ctx.diagnosis is None or not rule.needs(ctx.diagnosis))):
            continue
        answer = max(present, key=lambda a: sev[a])
        wanted = []
        for mv in rule.moves:
            spec = _spec(ctx, mv.suffix)
            if spec is None:
                continue
            old = parent.get(spec.key, spec.default)
            try:
                d = _direction(old, _apply_move(spec, old, mv.how, info))
            except (ValueError, TypeError):
                continue
            if d is not None:
                wanted.append((spec.key, d))
        hits = sum(1 for k, d in wanted if moved.get(k) == d)
        if not hits:
            continue
        against = sum(1 for k, d in wanted if k in moved and moved[k] != d)
        score = sev[answer] * rule.prior * (hits - 0.5 * against) / len(wanted)
        if score > 0:
            hit.append((answer, rule.family))
        if score > best:
            best, answer_of, answered = score, answer, f"{_finding_for(ctx.diagnosis, answer)} ({rule.name})"
    # the findings answered; ``healthy`` only through a family no finding's rule already moves (clip-higher
    # against an entropy fall is not also the healthy run's early clip-higher)
    findings = {a for a, _ in hit if a != "healthy"}
    covered = {f for a, f in hit if a != "healthy"}
    if any(a == "healthy" and f not in covered for a, f in hit):
        findings.add("healthy")
    return best, answer_of, answered, findings


def sibling_answers(ctx: AgentContext, sev: dict[str, float] | None = None) -> set[str]:
    """The findings transitions already run from this checkpoint answer (each sibling's best answer)."""
    if not ctx.traits.branches or not ctx.segment:
        return set()
    sev = severities(ctx) if sev is None else sev
    parent = dict(ctx.base_config)
    out = set()
    for t in ctx.history:
        if t.stage != ctx.stage or t.confirms or t.parent_step != ctx.segment[0]:
            continue
        changes = {k: v for k, v in t.config.items() if parent.get(k, _MISSING) != v}
        if changes:
            answer = _best_answer(ctx, changes, sev)[1]
            if answer is not None:
                out.add(answer)
    return out


def transition_score(ctx: AgentContext, overrides: dict[str, Any]) -> tuple[float, str | None]:
    """How well a transition (from any proposer) answers the diagnosis: the severity of the most severe finding
    it answers times the rule's prior, scaled by how much of the rule it follows (moves against it count
    half against), and by 1 + 0.5 per further finding it answers (a coordinated transition); with the
    finding's phrase. A transition that answers nothing scores 0.05 (an untested
    hypothesis is still worth a branch). One that answers a finding a sibling from the same checkpoint already
    answers scores half: the branches of a checkpoint test distinct hypotheses first (each finding gets its
    answer before a second idea for one, as the proposer orders them)."""
    sev = severities(ctx)
    best, answer, answered, families = _answers(ctx, overrides, sev)
    if len(families) > 1:  # coordinated: each further finding it answers adds half (LLMZero's multi-knob moves)
        best *= 1 + 0.5 * (len(families) - 1)
        answered = (answered or "") + f"; coordinated: answers {', '.join(sorted(families))}"
    if answer is not None and answer in sibling_answers(ctx, sev):
        best *= 0.5
        answered = (answered or "") + "; a sibling already answers this finding"
    parent = dict(ctx.base_config)
    new = ctx.full_config(overrides)
    moved = {k: d for k, v in new.items() if (d := _direction(parent.get(k), v)) is not None}
    shrunk = [k.rsplit(".", 1)[-1] for k, d in moved.items() if d == "down"
              and any(k == c or k.endswith("." + c) for c in CAPACITY_KNOBS)]
    if shrunk and "collapse" not in sev:  # LLMZero: capacity accumulates; shrinking it is the odd move out
        best *= 0.5
        answered = (answered + "; " if answered else "") + f"shrinks capacity ({', '.join(sorted(shrunk))})"
    return round(best, 4), answered
