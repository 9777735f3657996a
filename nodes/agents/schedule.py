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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from mart.state.metrics import StepRecord
from mart.state.models import Candidate, config_hash

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
FLAT_SLOPE = 0.002
"""Relative change per step under which a reward or validation curve counts as flat."""
UNSTABLE_EVENTS = {"kl_blowup", "grad_norm_explosion", "reward_collapse", "nan", "loss_spike"}


class Diagnosis(BaseModel):
    """The trajectory so far at a checkpoint (None where the metric is absent)."""

    step: int | None = Field(None, description="global step of the checkpoint")
    entropy: float | None = Field(None, description="actor/entropy at the checkpoint (mean of the last steps)")
    entropy_start: float | None = Field(None, description="actor/entropy at the first step")
    entropy_ratio: float | None = Field(None, description="entropy now / at the first step")
    entropy_slope: float | None = Field(None, description="relative change per step over the last window")
    kl: float | None = Field(None, description="actor/kl_loss (or actor/ppo_kl without a KL loss)")
    kl_slope: float | None = None
    pg_clipfrac: float | None = None
    grad_norm: float | None = None
    grad_norm_slope: float | None = None
    response_length: float | None = None
    response_length_slope: float | None = None
    response_clip_ratio: float | None = Field(None, description="share of responses cut at max_response_length")
    reward: float | None = None
    reward_slope: float | None = None
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


def _series(records: Sequence[StepRecord], keys: Sequence[str] | str) -> list[tuple[int, float]]:
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    for key in keys:  # the first key the stream has wins (kl_loss before ppo_kl)
        pts = [(r.step, r.data[key]) for r in records if key in r.data and math.isfinite(r.data[key])]
        if pts:
            return pts
    return []


def _val_series(records: Sequence[StepRecord]) -> list[tuple[int, float]]:
    key = next((k for r in records for k in sorted(r.data) if k.startswith(VAL_PREFIX)
                and math.isfinite(r.data[k])), None)
    return _series(records, key) if key else []


def _mean(pts: Sequence[tuple[int, float]]) -> float:
    return sum(v for _, v in pts) / len(pts)


def _rel_slope(pts: Sequence[tuple[int, float]]) -> float | None:
    """Least-squares slope per step divided by the mean magnitude (relative change per step)."""
    if len(pts) < 2:
        return None
    xs = [float(s) for s, _ in pts]
    ys = [v for _, v in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var
    scale = sum(abs(y) for y in ys) / len(ys)
    return slope / scale if scale > 1e-12 else 0.0


def _tail(pts: list[tuple[int, float]], window: int) -> list[tuple[int, float]]:
    if not pts:
        return []
    last = pts[-1][0]
    return [p for p in pts if p[0] > last - window] or pts[-1:]


def _r(v: float | None, n: int = 4) -> float | None:
    return None if v is None or not math.isfinite(v) else float(f"{v:.{n}g}")


def diagnose(records: Sequence[StepRecord], health_events: Sequence[str] = (), window: int | None = None) -> Diagnosis:
    """The diagnosis of a trajectory (verl step records, in any order) at its last step.

    ``window``: steps of the last segment that slopes and current levels are measured over (default: the last
    third of the trajectory, at least 3 steps). ``health_events``: the health monitor's rule names or messages.
    """
    recs = sorted(records, key=lambda r: r.step)
    events = [str(e) for e in health_events]
    if not recs:
        return Diagnosis(health_events=events)
    span = recs[-1].step - recs[0].step + 1
    w = window if window and window > 0 else max(3, span // 3)
    # levels "now" over a short tail (noise), slopes over the window
    now_w = max(1, min(w, 3))

    def level(pts: list[tuple[int, float]]) -> float | None:
        return _mean(_tail(pts, now_w)) if pts else None

    def slope(pts: list[tuple[int, float]]) -> float | None:
        return _rel_slope(_tail(pts, w))

    ent, kl, clipf = _series(recs, ENTROPY), _series(recs, KL_KEYS), _series(recs, CLIPFRAC)
    gn, rl, rc = _series(recs, GRAD_NORM), _series(recs, RESP_LEN), _series(recs, RESP_CLIP)
    rew, val = _series(recs, REWARD_KEYS), _val_series(recs)
    d = Diagnosis(step=recs[-1].step, health_events=events)
    if ent:
        d.entropy_start = _r(ent[0][1])
        d.entropy = _r(level(ent))
        d.entropy_slope = _r(slope(ent), 3)
        if ent[0][1] > 1e-9 and d.entropy is not None:
            d.entropy_ratio = _r(d.entropy / ent[0][1], 3)
    d.kl, d.kl_slope = _r(level(kl)), _r(slope(kl), 3)
    d.pg_clipfrac = _r(level(clipf))
    d.grad_norm, d.grad_norm_slope = _r(level(gn)), _r(slope(gn), 3)
    d.response_length, d.response_length_slope = _r(level(rl)), _r(slope(rl), 3)
    d.response_clip_ratio = _r(level(rc))
    d.reward, d.reward_slope = _r(level(rew)), _r(slope(rew), 3)
    if val:
        d.val_score = _r(val[-1][1])
        d.val_best = _r(max(v for _, v in val))
        d.val_slope = _r(_rel_slope(_tail(val, max(w, 2 * (val[-1][0] - val[-2][0]) if len(val) > 1 else w))), 3)
    _find(d, rl)
    return d


def _find(d: Diagnosis, resp_len: list[tuple[int, float]]) -> None:
    """Fill ``findings`` and ``severity`` from the measured levels and slopes."""
    found: list[tuple[float, str, str]] = []  # (severity, pathology, phrase)

    def add(name: str, sev: float, phrase: str) -> None:
        sev = max(0.0, min(1.0, sev))
        if sev > d.severity.get(name, 0.0):
            d.severity[name] = round(sev, 3)
        found.append((sev, name, phrase))

    falling = d.entropy_slope is not None and d.entropy_slope < -FLAT_SLOPE
    rising = d.entropy_slope is not None and d.entropy_slope > FLAT_SLOPE
    if d.entropy_ratio is not None and d.step is not None:
        fell = 1 - d.entropy_ratio
        if d.entropy_ratio < COLLAPSE_RATIO or (d.entropy_ratio < 0.6 and falling):
            sev = 0.45 + 0.5 * fell + (0.15 if falling else 0.0)
            add("entropy_collapse", sev, f"entropy fell {fell:.0%} since the first step"
                + (" and is still falling" if falling else ""))
        elif d.entropy_ratio > EXPLOSION_RATIO and rising:
            add("entropy_explosion", 0.4 + 0.3 * min(d.entropy_ratio - 1, 1.5),
                f"entropy rose {d.entropy_ratio - 1:.0%} above its first value and is still rising")
    if d.response_clip_ratio is not None and d.response_clip_ratio >= CLIP_RATIO_WARN:
        growing = (d.response_length_slope or 0) > FLAT_SLOPE
        add("length_clipping", 0.35 + 2.0 * d.response_clip_ratio + (0.1 if growing else 0.0),
            f"{d.response_clip_ratio:.0%} of responses hit the length limit"
            + (" and responses are still growing" if growing else ""))
    drift = []
    if d.kl_slope is not None and d.kl_slope > 0.02 and (d.kl or 0) > 1e-3:
        drift.append(f"KL to the reference rising {d.kl_slope:.1%}/step")
    if d.grad_norm_slope is not None and d.grad_norm_slope > 0.02:
        drift.append(f"grad norm rising {d.grad_norm_slope:.1%}/step")
    if d.pg_clipfrac is not None and d.pg_clipfrac > 0.2:
        drift.append(f"{d.pg_clipfrac:.0%} of tokens clipped")
    if drift:
        add("policy_drift", 0.3 + 0.2 * len(drift), "the policy drifts: " + ", ".join(drift))
    bad = sorted({e for e in d.health_events for rule in UNSTABLE_EVENTS if rule in e})
    if bad:
        add("instability", 0.9, "health events: " + ", ".join(bad))
    if d.val_score is not None and d.val_best is not None and d.val_best > 0 \
            and d.val_score < d.val_best * 0.95 and (d.val_slope or 0) < 0:
        add("val_decline", 0.5 + min(0.4, (d.val_best - d.val_score) / d.val_best),
            f"validation fell from its best {d.val_best:.3g} to {d.val_score:.3g}")
    flat_val = d.val_slope is not None and abs(d.val_slope) < FLAT_SLOPE
    flat_rew = d.reward_slope is not None and abs(d.reward_slope) < FLAT_SLOPE
    if (flat_val or (d.val_slope is None and flat_rew)) and "val_decline" not in d.severity:
        add("plateau", 0.3, "validation has stopped improving" if flat_val else "reward has stopped improving")
    found.sort(key=lambda t: -t[0])
    d.findings = [phrase for _, _, phrase in found]
    if not d.findings:
        d.findings = ["no pathology: entropy, KL, lengths and scores look healthy"]


# --------------------------------------------------------------------------- transitions


def knob_stage(stage: str) -> str:
    """The search-space stage whose knobs a tuning stage moves: ``schedule`` moves the learning knobs."""
    return "learning" if stage == "schedule" else stage


@dataclass
class Move:
    """One knob's change inside a transition."""

    suffix: str
    how: str
    """``x2``, ``/2``, ``up``, ``+0.08``, ``atleast:0.28``, ``atmost:0.2``, ``on``, ``off``."""


@dataclass
class Rule:
    """A transition template: which finding it answers, the knob moves, the public source."""

    name: str
    answers: str
    """The pathology it answers (``healthy`` for the capacity moves offered on any trajectory)."""
    moves: list[Move]
    why: str
    prior: float = 0.5
    family: str = field(default="")


RULES: list[Rule] = [
    Rule("clip-higher", "entropy_collapse",
         [Move("clip_ratio_high", "atleast:0.28")],
         "clip-higher lets low-probability tokens grow and keeps entropy up (DAPO, arXiv 2503.14476: 0.28)",
         0.9, "entropy"),
    Rule("entropy-bonus", "entropy_collapse",
         [Move("entropy_coeff", "up"), Move("rollout.temperature", "+0.1")],
         "an entropy bonus steered toward a target entropy (Skywork-OR1 adaptive entropy control, "
         "arXiv 2505.22312) with hotter sampling (POLARIS) restores exploration", 0.75, "entropy"),
    Rule("hotter-sampling", "entropy_collapse",
         [Move("rollout.temperature", "+0.2"), Move("clip_ratio_high", "+0.04")],
         "diversity collapsed: a higher sampling temperature (POLARIS) and a wider upper clip", 0.6, "temperature"),
    Rule("cool-down", "entropy_explosion",
         [Move("entropy_coeff", "/2"), Move("clip_ratio_high", "atmost:0.2"), Move("rollout.temperature", "-0.1")],
         "entropy runs away: lower the entropy bonus (Skywork-OR1 lowers it above target) and close clip-higher",
         0.85, "entropy"),
    Rule("longer-budget", "length_clipping",
         [Move("max_response_length", "x2")],
         "responses hit the length limit: double the budget, in stages (Skywork-OR1 8k->16k->32k, DeepScaleR "
         "8k->16k->24k)", 0.9, "capacity"),
    Rule("kl-anchor", "policy_drift",
         [Move("use_kl_loss", "on"), Move("kl_loss_coef", "x2"), Move("optim.lr", "/2")],
         "the policy drifts from the reference: a stronger KL-to-reference loss and a smaller step", 0.8, "kl"),
    Rule("tighter-trust-region", "policy_drift",
         [Move("clip_ratio_low", "-0.04"), Move("clip_ratio_high", "-0.04"), Move("optim.lr", "/2")],
         "many tokens clipped and the update grows: a narrower clip range and a smaller step", 0.55, "clip"),
    Rule("stabilise", "instability",
         [Move("optim.lr", "/2"), Move("use_kl_loss", "on"), Move("kl_loss_coef", "x2")],
         "health events: halve the learning rate and anchor to the reference", 0.95, "lr"),
    Rule("anneal", "val_decline",
         [Move("optim.lr", "/2")],
         "validation fell from its best: a smaller learning rate (the classic step decay)", 0.8, "lr"),
    Rule("anneal-plateau", "plateau",
         [Move("optim.lr", "/2")],
         "validation stopped improving: lower the learning rate (step decay on plateau)", 0.45, "lr"),
    Rule("more-rollouts", "healthy",
         [Move("rollout.n", "x2")],
         "capacity accumulates across segments (LLMZero): more samples per prompt for the next segment", 0.5,
         "capacity"),
    Rule("bigger-batch", "healthy",
         [Move("train_batch_size", "x2"), Move("ppo_mini_batch_size", "x2")],
         "capacity accumulates across segments (LLMZero): more prompts per step", 0.35, "capacity"),
    Rule("explore-more", "healthy",
         [Move("clip_ratio_high", "+0.04"), Move("rollout.temperature", "+0.1")],
         "regularisation oscillates with the dynamics (LLMZero): loosen the upper clip and sample hotter while "
         "the trajectory is healthy", 0.3, "entropy"),
    Rule("consolidate", "healthy",
         [Move("optim.lr", "/2"), Move("rollout.n", "x2")],
         "later segments: a smaller step with more rollouts per prompt (capacity up, step size down)", 0.3,
         "lr"),
]


def _spec(ctx: AgentContext, suffix: str) -> ParamSpec | None:
    stage = knob_stage(ctx.stage)
    for p in ctx.search_space.stage_params(stage):  # type: ignore[arg-type]
        if p.key == suffix or p.key.endswith("." + suffix):
            return p
    return None


def _apply_move(spec: ParamSpec, value: Any, how: str) -> Any:
    """The new value of a knob (clamped to its range), or ``value`` itself when the move cannot apply."""
    if spec.kind == "bool":
        return how == "on" if how in ("on", "off") else value
    if spec.kind == "categorical" or spec.low is None or spec.high is None:
        return value
    v = float(value if value is not None else spec.default if spec.default is not None else spec.low)
    if how.startswith("atleast:"):  # raise to a published value, never lower
        nv = max(v, float(how.split(":")[1]))
    elif how.startswith("atmost:"):
        nv = min(v, float(how.split(":")[1]))
    elif how == "x2":  # from zero, the knob's default (verl's kl_loss_coef 0.001) or a small step into the range
        nv = v * 2 if v > 0 else float(spec.default or 0) or spec.low + (spec.high - spec.low) * 0.01
    elif how == "/2":
        nv = v / 2
    elif how == "up":  # from zero, a small step into the range (an additive knob such as entropy_coeff)
        nv = v * 2 if v > 0 else spec.low + (spec.high - spec.low) * 0.1
    elif how[0] in "+-":
        nv = v + float(how)
    else:
        return value
    nv = min(spec.high, max(spec.low, nv))
    if spec.kind == "int":
        nv = int(round(nv))
    else:
        nv = float(f"{nv:.4g}")
    return spec.validate(nv)


def _direction(old: Any, new: Any) -> str | None:
    if isinstance(new, bool) or isinstance(old, bool):
        return None if bool(old) == bool(new) else ("up" if new else "down")
    try:
        return None if float(new) == float(old) else ("up" if float(new) > float(old) else "down")
    except (TypeError, ValueError):
        return None


def tried_keys(ctx: AgentContext) -> set[str]:
    """Config hashes already tried from this checkpoint: the siblings of this segment and the rejected.

    A config run from another checkpoint is no duplicate (its weights differ); without ``ctx.segment`` every
    trial of the stage counts."""
    keys = {config_hash(ctx.full_config(o)) for o in ctx.rejected}
    frm = ctx.segment[0] if ctx.segment else None
    for t in ctx.history:
        if t.stage != ctx.stage:
            continue
        if frm is None or t.parent_step == frm or (not frm and t.parent_step is None):
            keys.add(config_hash(t.config))
    return keys


def _severity(d: Diagnosis | None, ctx: AgentContext) -> dict[str, float]:
    sev = dict(d.severity) if d is not None else {}
    events = {e.rule for e in ctx.health_events}
    if events & UNSTABLE_EVENTS:
        sev["instability"] = max(sev.get("instability", 0.0), 0.9)
    if "entropy_collapse" in events:
        sev["entropy_collapse"] = max(sev.get("entropy_collapse", 0.0), 0.7)
    sev["healthy"] = 0.25
    return sev


def _build(ctx: AgentContext, rule: Rule, start: dict[str, Any], fb: FeedbackRules,
           diag: Diagnosis | None) -> tuple[dict[str, Any], list[str]] | None:
    """The overrides of one rule applied to ``start``, following the feedback; None when nothing moves."""
    current = ctx.full_config(start)
    overrides = dict(start)
    moved: list[str] = []
    for mv in rule.moves:
        spec = _spec(ctx, mv.suffix)
        if spec is None:
            continue
        old = current.get(spec.key, spec.default)
        try:
            new = _apply_move(spec, old, mv.how)
        except Exception:  # noqa: BLE001 - a value the spec refuses: skip this knob
            continue
        direction = _direction(old, new)
        if direction is None or not fb.allows(spec.key, direction):
            continue
        if spec.key.endswith("kl_loss_coef") and not current.get(_key(ctx, "use_kl_loss") or "", True) \
                and "use_kl_loss" not in [m.suffix for m in rule.moves]:
            continue
        overrides[spec.key] = new
        moved.append(f"{spec.key.rsplit('.', 1)[-1]} {_fmt(old)}->{_fmt(new)}")
    if not moved:
        return None
    for k in list(overrides):  # a value equal to the base is no override
        if k not in start and ctx.base_config.get(k, _MISSING) == overrides[k]:
            overrides.pop(k)
    return overrides, moved


def _key(ctx: AgentContext, suffix: str) -> str | None:
    spec = _spec(ctx, suffix)
    return spec.key if spec else None


_MISSING = object()


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else repr(v)


def transition_candidates(ctx: AgentContext) -> list[Candidate]:
    """``ctx.num_candidates`` transitions for the next segment, most severe finding first, diverse families."""
    from mart.nodes.agents.feedback import parse_feedback

    fb = parse_feedback(ctx.feedback, ctx.search_space)
    diag = ctx.diagnosis
    sev = _severity(diag, ctx)
    start = dict(ctx.best_overrides)
    # the parent's own config continuing is no transition (the stage runs it, or not, by itself)
    tried = ctx.tried_keys() | {config_hash(ctx.full_config(start))}
    scored: list[tuple[float, str, Candidate]] = []
    for rule in RULES:
        if rule.answers not in sev:
            continue
        built = _build(ctx, rule, start, fb, diag)
        if built is None:
            continue
        overrides, moved = built
        full = ctx.full_config(overrides)
        if config_hash(full) in tried or ctx.config_errors(overrides):
            continue
        score = sev[rule.answers] * rule.prior
        focus = [m for m in rule.moves if (_key(ctx, m.suffix) or "") in fb.focus]
        if focus:
            score = score * 2 + 0.5
        finding = _finding_for(diag, rule.answers)
        seg = f" for steps {ctx.segment[0]}-{ctx.segment[1]}" if ctx.segment else ""
        rationale = f"{finding} -> {', '.join(moved)}{seg}: {rule.why}."
        if focus:
            rationale += " The reviewer asked for this change."
        cand = Candidate(candidate_id="", stage=ctx.stage, overrides=overrides, source="rules", rationale=rationale,
                         predicted_memory_gb=ctx.predict_memory(full), expected_gain=round(score, 4))
        scored.append((score, rule.family or rule.name, cand))
    scored.sort(key=lambda t: -t[0])
    return _diverse(scored, ctx.num_candidates)


def _finding_for(diag: Diagnosis | None, pathology: str) -> str:
    if pathology == "healthy":
        return "Healthy trajectory" if diag is None or not diag.severity else "Alongside the findings"
    if diag is not None:
        for phrase in diag.findings:
            if _PHRASE_OF.get(pathology, "@") in phrase:
                return phrase[0].upper() + phrase[1:]
    return pathology.replace("_", " ").capitalize()


_PHRASE_OF = {"entropy_collapse": "entropy fell", "entropy_explosion": "entropy rose", "length_clipping": "length limit",
              "policy_drift": "drifts", "instability": "health events", "val_decline": "validation fell",
              "plateau": "stopped improving"}


def _diverse(scored: list[tuple[float, str, Candidate]], k: int) -> list[Candidate]:
    """The best candidate of each family first, then the rest by score; no two with the same config."""
    out: list[Candidate] = []
    seen: set[str] = set()
    families: set[str] = set()
    for _, fam, cand in scored:
        if fam not in families and cand.key() not in seen:
            out.append(cand)
            families.add(fam)
            seen.add(cand.key())
    rest = [c for _, _, c in scored if c.key() not in seen]
    ordered = sorted(out, key=lambda c: -(c.expected_gain or 0))[:k]
    for c in rest:
        if len(ordered) >= k:
            break
        if c.key() not in {o.key() for o in ordered}:
            ordered.append(c)
    return ordered[:k]


def transition_score(ctx: AgentContext, overrides: dict[str, Any]) -> tuple[float, str | None]:
    """How well a transition (from any proposer) answers the diagnosis: the severity of the most severe finding
    it answers, times how much of a rule for that finding it follows; with the finding's phrase.

    A transition that answers no finding still scores a little (an untested hypothesis is worth a branch)."""
    sev = _severity(ctx.diagnosis, ctx)
    parent = ctx.full_config(dict(ctx.best_overrides))
    new = ctx.full_config(overrides)
    moved = {}
    for key, value in new.items():
        d = _direction(parent.get(key), value) if key in parent else None
        if d is not None:
            moved[key] = d
    best, answered = 0.05, None
    for rule in RULES:
        if rule.answers not in sev:
            continue
        wanted = []
        for mv in rule.moves:
            spec = _spec(ctx, mv.suffix)
            if spec is None:
                continue
            try:
                target = _apply_move(spec, parent.get(spec.key, spec.default), mv.how)
            except Exception:  # noqa: BLE001 - the rule cannot move this knob here
                continue
            d = _direction(parent.get(spec.key, spec.default), target)
            if d is not None:
                wanted.append((spec.key, d))
        if not wanted:
            continue
        hits = sum(1 for k, d in wanted if moved.get(k) == d)
        against = sum(1 for k, d in wanted if k in moved and moved[k] != d)
        if not hits:
            continue
        score = sev[rule.answers] * rule.prior * (hits - 0.5 * against) / len(wanted)
        if score > best:
            best, answered = score, (_finding_for(ctx.diagnosis, rule.answers) + f" ({rule.name})")
    return round(best, 4), answered
