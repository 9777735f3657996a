"""The simulator's learning model as it was before schedules (commit ccbfde6), frozen for regression tests.

Issue 13 made the learning model path-consistent (every knob-dependent term acts per step and accumulates
into the checkpointed state). A static config's trajectory must not change: stage 1/2 and every benchmark
figure rest on it. ``tests/trial_runner/test_sim_schedule.py`` compares the new model with this copy over
the shipped scenarios and a range of configs. Do not edit (it is a recording, not code under test).
"""

# ruff: noqa
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from mart.trial_runner.sim.scenarios import Scenario

ARR = "actor_rollout_ref"
A, R = f"{ARR}.actor.", f"{ARR}.rollout."

AGG_SCALE = {"token-mean": 1.0, "seq-mean-token-mean": 1.0, "seq-mean-token-sum-norm": 1.0, "token-sum": 3.0, "seq-mean-token-sum": 2.0}
AGG_QUALITY = {"token-mean": 1.0, "seq-mean-token-mean": 0.97, "seq-mean-token-sum-norm": 0.99, "token-sum": 0.95, "seq-mean-token-sum": 0.93}
AGG_LENGTH = {"token-mean": 1.0, "seq-mean-token-mean": 0.9, "seq-mean-token-sum-norm": 1.0, "token-sum": 1.1, "seq-mean-token-sum": 1.3}
KL_TYPE_HAZARD = {"low_var_kl": 1.0, "mse": 1.0, "kl": 1.1, "abs": 1.15}


@dataclass(frozen=True)
class LearningKnobs:
    lr: float
    warmup_ratio: float
    weight_decay: float
    clip_grad: float
    use_kl: bool
    kl_coef: float
    kl_type: str
    entropy_coeff: float
    clip_low: float
    clip_high: float
    loss_agg: str
    ppo_epochs: int
    mini_batch: int
    n: int
    temperature: float
    top_p: float
    train_batch: int
    max_response_length: int
    norm_adv: bool

    @classmethod
    def from_config(cls, config: dict[str, Any], sc: Scenario) -> LearningKnobs:
        def get(key: str, default: Any) -> Any:
            v = config.get(key, default)
            return default if v is None else v

        def as_bool(v: Any) -> bool:
            return v if isinstance(v, bool) else str(v).lower() in ("true", "1", "yes")

        return cls(
            lr=float(get(A + "optim.lr", 1e-6)),
            warmup_ratio=float(get(A + "optim.lr_warmup_steps_ratio", 0.0)),
            weight_decay=float(get(A + "optim.weight_decay", 0.01)),
            clip_grad=float(get(A + "optim.clip_grad", 1.0)),
            use_kl=as_bool(get(A + "use_kl_loss", False)),
            kl_coef=float(get(A + "kl_loss_coef", 0.001)),
            kl_type=str(get(A + "kl_loss_type", "low_var_kl")),
            entropy_coeff=float(get(A + "entropy_coeff", 0.0)),
            clip_low=float(get(A + "clip_ratio_low", 0.2)),
            clip_high=float(get(A + "clip_ratio_high", 0.2)),
            loss_agg=str(get(A + "loss_agg_mode", "token-mean")),
            ppo_epochs=int(get(A + "ppo_epochs", 1)),
            mini_batch=int(get(A + "ppo_mini_batch_size", 256)),
            n=int(get(R + "n", sc.rollout_n)),
            temperature=float(get(R + "temperature", 1.0)),
            top_p=float(get(R + "top_p", 1.0)),
            train_batch=int(get("data.train_batch_size", sc.train_batch_size)),
            max_response_length=int(get("data.max_response_length", sc.max_response_length)),
            norm_adv=as_bool(get("algorithm.norm_adv_by_std_in_grpo", True)),
        )

    @property
    def updates_per_step(self) -> float:
        return max(1.0, self.train_batch / max(self.mini_batch, 1)) * max(self.ppo_epochs, 1)


# ------------------------------------------------------------------------------------------ length stats
_NORM = NormalDist()


def length_stats(mean_untruncated: float, cv: float, max_len: float, n_seqs: int) -> tuple[float, float, float, float]:
    """(mean, std, max, clip_ratio) of ``n_seqs`` lognormal response lengths truncated at ``max_len``."""
    mean_untruncated = max(mean_untruncated, 1.0)
    s2 = math.log(1 + cv * cv)
    s = math.sqrt(s2)
    mu = math.log(mean_untruncated) - s2 / 2
    z = (math.log(max_len) - mu) / s
    clip = 1 - _NORM.cdf(z)
    e1 = math.exp(mu + s2 / 2) * _NORM.cdf(z - s) + max_len * clip
    e2 = math.exp(2 * mu + 2 * s2) * _NORM.cdf(z - 2 * s) + max_len * max_len * clip
    std = math.sqrt(max(e2 - e1 * e1, 0.0))
    if n_seqs * clip >= 0.5:
        longest = float(max_len)
    else:
        longest = min(float(max_len), math.exp(mu + s * _NORM.inv_cdf(1 - 0.5 / max(n_seqs, 1))))
    return e1, std, longest, clip


def clip_ratio(mean_untruncated: float, cv: float, max_len: float) -> float:
    """Share of lognormal response lengths (mean, cv) reaching ``max_len`` (verl's response_length/clip_ratio)."""
    s2 = math.log(1 + cv * cv)
    z = (math.log(max_len) - math.log(max(mean_untruncated, 1.0)) + s2 / 2) / math.sqrt(s2)
    return 0.5 * math.erfc(z / math.sqrt(2))


# ------------------------------------------------------------------------------------------ dynamics
ENT_FAST = 5.0  # entropy pressure (progress at verl's defaults) of the fast early drop's e-folding
ENT_PLATEAU = 0.2  # share of the starting entropy the fast drop leaves (no clip-higher)
ENT_SLOW = 0.005  # slow decline per unit of pressure after the drop
ENT_RUNAWAY = 6.0  # an entropy runaway (large bonus) saturates at this multiple of the start
EXHAUSTION_MAX = 0.5  # an exhausted policy loses at most half the headroom


def _speed(x: float) -> float:
    return x if x <= 1 else 1 + 0.35 * math.log(x)


def _quality(k: LearningKnobs) -> float:
    q_n = 1 - math.exp(-(k.n - 1) / 3.5)
    t = k.temperature
    q_t = math.exp(-(((t - 1.0) / 0.35) ** 2)) if t >= 1.0 else math.exp(-(((1.0 - t) / 0.5) ** 2))
    q_p = 1 - 0.5 * (1 - k.top_p) ** 2
    q_clip = 1 + 0.06 * min(1.0, max(0.0, k.clip_high - k.clip_low) / 0.08)
    q_clip *= 1 - 0.5 * max(0.0, 0.1 - k.clip_low)  # too narrow a lower clip stalls updates
    q_agg = AGG_QUALITY.get(k.loss_agg, 0.95)
    q_norm = 1.0 if k.norm_adv else 1.01
    q_wd = 1 - max(0.0, k.weight_decay - 0.1)
    q_kl = 1 / (1 + k.kl_coef / 0.02) if k.use_kl else 1.0
    e = k.entropy_coeff
    q_ent = 1 + 0.04 * min(1.0, e / 0.001) - 8 * max(0.0, e - 0.002)
    return q_n * q_t * q_p * q_clip * q_agg * q_norm * q_wd * q_kl * q_ent


def _aggressiveness(k: LearningKnobs, sc: Scenario) -> float:
    """Normalised step size: 1 = where progress per step saturates."""
    clip_scale = math.sqrt((k.clip_low + k.clip_high) / 0.4)
    x = k.lr / sc.learning.lr_opt * math.sqrt(k.updates_per_step) * AGG_SCALE.get(k.loss_agg, 1.0) * clip_scale
    grad_norm = 0.3 * (1 + 0.1 * x)
    return x * min(1.0, k.clip_grad / grad_norm)  # clipping bounds the step


def _collapse_threshold(k: LearningKnobs) -> float:
    xc = 3.5
    if k.use_kl:
        xc *= 1 + 0.5 * math.log10(1 + k.kl_coef / 1e-4)
    xc *= max(0.5, k.clip_grad) ** -0.15
    xc *= 1.0 if k.norm_adv else 1.05
    xc /= 1 + 0.3 * (k.ppo_epochs - 1)
    return xc


@dataclass
class LearningTrajectory:
    """Per-step (index 0 = step 1) learning state; ``collapse_step`` is None when it never collapsed."""

    score: list[float]  # noise-free validation mean@1 after each step
    score0: float
    reward: list[float]
    entropy: list[float]
    ppo_kl: list[float]
    kl_loss: list[float]
    grad_norm: list[float]
    pg_clipfrac: list[float]
    lr: list[float]
    resp_mean_untruncated: list[float]
    collapse_step: int | None
    collapse_kind: str | None
    x: float
    quality: float
    hazard: list[float] = field(default_factory=list)
    first_step: int = 1  # global step of index 0 (> 1 for a branch started from a checkpoint)
    states: list[dict[str, Any]] = field(default_factory=list)  # the learning state after each step (checkpoints)

    def state_at(self, step: int) -> dict[str, Any]:
        return self.states[step - self.first_step]


def learning_trajectory(config: dict[str, Any], sc: Scenario, steps: int, collapse_draw: float,
                        start: dict[str, Any] | None = None) -> LearningTrajectory:
    """The noise-free learning dynamics over global steps ``start_step+1 .. steps``.

    Args:
        collapse_draw: the Exp(1) threshold the cumulative collapse hazard must pass (``math.inf``: never;
            ``1.0``: the noise-free reference used by the ground truth).
        start: a learning state from ``LearningTrajectory.states`` (a checkpoint): the trajectory continues
            from it under ``config``'s knobs (a branch) instead of starting from the base model.
    """
    k = LearningKnobs.from_config(config, sc)
    lp = sc.learning
    x = _aggressiveness(k, sc)
    q = _quality(k)
    xc = _collapse_threshold(k)
    penalty = 0.25 * max(0.0, math.log(max(x, 1e-12))) ** 2
    data_rate = (k.train_batch / sc.train_batch_size) ** 0.25
    warm = k.warmup_ratio * steps
    hz_mult = KL_TYPE_HAZARD.get(k.kl_type, 1.0) if k.use_kl else 1.0
    # entropy pressure per unit of progress (1 at verl's defaults): faster at low temperature and top-p,
    # slower with clip-higher, an entropy bonus or a KL loss anchoring the policy to the reference
    clip_higher = min(1.0, max(0.0, k.clip_high - k.clip_low) / 0.08)
    decay = (1 / max(k.temperature, 0.05)) ** 2
    decay /= 1 + 0.5 * clip_higher
    decay /= 1 + k.entropy_coeff / 0.0015
    decay /= 0.6 + 0.4 * k.top_p
    if k.use_kl:
        decay /= 1 + k.kl_coef / 0.005
    # two phases (Cui et al. 2025): a fast early drop to a plateau, then a slow decline toward zero;
    # clip-higher raises the plateau and all but stops the decline (DAPO)
    plateau = ENT_PLATEAU + 0.3 * clip_higher
    slow = ENT_SLOW * (1 - 0.9 * clip_higher)
    ent_growth = max(0.0, k.entropy_coeff - 0.003) * 20  # a big entropy bonus inflates entropy
    ent1 = lp.entropy0 * k.temperature * (0.7 + 0.3 * k.top_p)
    ent_cap = min(ENT_RUNAWAY * ent1, 0.5 * math.log(sc.model.vocab))  # a runaway saturates well below ln(vocab)
    pressure, log_growth = 0.0, 0.0
    length_gain = lp.resp_growth * AGG_LENGTH.get(k.loss_agg, 1.0)

    out = LearningTrajectory([], lp.score0, [], [], [], [], [], [], [], [], None, None, x, q)
    progress, cum_hazard = 0.0, 0.0
    exhausted_at: int | None = None
    updates = k.updates_per_step
    s_pre, ent_pre = lp.score0, ent1
    first = 1
    if start is not None:  # a branch: the accumulated progress, entropy pressure, hazard and collapse carry over
        first = int(start["step"]) + 1
        progress, pressure, log_growth = start["progress"], start["pressure"], start["log_growth"]
        cum_hazard, exhausted_at = start["cum_hazard"], start["exhausted_at"]
        out.collapse_step, out.collapse_kind = start["collapse_step"], start["collapse_kind"]
        s_pre, ent_pre = start["s_pre"], start["ent_pre"] * ent1 / start["ent1"]
        out.score0 = start["score"]
    out.first_step = first
    for t in range(first, steps + 1):
        ramp = min(1.0, t / warm) if warm >= 1 else 1.0
        xt = x * ramp
        ent = ent1 * (plateau + (1 - plateau) * math.exp(-pressure / ENT_FAST)) * math.exp(-slow * pressure + log_growth)
        ent = min(ent, ent_cap)
        explore = math.sqrt(min(1.0, ent / ent1))
        mean_len = lp.resp_len0 * (1 + length_gain * (1 - math.exp(-progress / 30.0)))
        clip = clip_ratio(mean_len, sc.resp_cv, k.max_response_length)
        progress += _speed(xt) * data_rate * explore * (1 - 0.6 * clip)
        pressure += decay * _speed(xt) * data_rate
        log_growth += ent_growth
        hazard = 0.5 * (xt / xc) ** 6 * hz_mult + 0.3 * max(0.0, ent / ent1 - 2.0) ** 2
        cum_hazard += hazard
        out.hazard.append(hazard)
        gain = lp.headroom * q * (1 - math.exp(-progress / lp.tau_steps)) * (1 - min(0.9, penalty))
        gain -= lp.headroom * 0.6 * clip  # truncated answers score zero
        if ent / ent1 < 0.1:  # entropy exhausted: the policy stops improving and slowly degrades
            exhausted_at = exhausted_at or t
            gain -= lp.headroom * min(EXHAUSTION_MAX, 0.02 * (t - exhausted_at))  # bounded: a pass rate
        if out.collapse_step is None and cum_hazard >= collapse_draw:
            out.collapse_step = t
            out.collapse_kind = "explode"
        grad_norm = 0.3 * (1 + 0.1 * xt) * (1 + (1 - explore))
        ppo_kl = 2e-4 * xt * math.sqrt(updates) * (1 + 0.5 * (k.ppo_epochs - 1))
        clipfrac = min(0.5, 0.002 * xt * updates * (0.2 / max(k.clip_low, 0.01)))
        kl_loss = 1e-3 * progress / (1 + k.kl_coef / 0.005) if k.use_kl else 0.0
        score = lp.score0 + gain
        reward = lp.reward0 * (0.6 + 0.4 * math.exp(-(((k.temperature - 0.8) / 0.8) ** 2))) + 2.5 * gain
        if out.collapse_step is not None:
            j = t - out.collapse_step + 1
            f = 1 - math.exp(-j / 2.0)
            if j == 1:
                s_pre, ent_pre = score, ent
            score = s_pre - (s_pre - 0.35 * lp.score0) * f
            reward = reward * (1 - 0.7 * f)
            ent = min(ent_pre * (1 + 4 * f), max(ent_cap, ent_pre))
            grad_norm *= 5 + 20 * f
            ppo_kl = ppo_kl + 2.0 * f
            kl_loss = kl_loss + (0.5 * f if k.use_kl else 0.0)
            clipfrac = min(0.6, clipfrac + 0.3 * f)
            mean_len = mean_len + (k.max_response_length * 1.2 - mean_len) * f  # repetition to the limit
        out.score.append(score)
        out.reward.append(reward)
        out.entropy.append(ent)
        out.ppo_kl.append(ppo_kl)
        out.kl_loss.append(kl_loss)
        out.grad_norm.append(grad_norm)
        out.pg_clipfrac.append(clipfrac)
        out.lr.append(k.lr * ramp)
        out.resp_mean_untruncated.append(mean_len)
        out.states.append({"step": t, "progress": progress, "pressure": pressure, "log_growth": log_growth,
                           "cum_hazard": cum_hazard, "exhausted_at": exhausted_at, "collapse_step": out.collapse_step,
                           "collapse_kind": out.collapse_kind, "s_pre": s_pre, "ent_pre": ent_pre, "ent1": ent1,
                           "score": score, "collapse_draw": collapse_draw})
    if out.collapse_step is None and out.entropy and out.entropy[-1] / ent1 < 0.15:
        out.collapse_kind = "entropy"
    return out


def final_score_noise_free(config: dict[str, Any], sc: Scenario, steps: int, n_draws: int = 16) -> float:
    """Expected validation score after ``steps`` steps, without measurement noise.

    The collapse threshold is Exp(1)-distributed; the expectation averages the final score over
    ``n_draws`` equally likely quantiles of it (the pre-collapse dynamics do not depend on the draw, so
    each distinct collapse step is simulated once).
    """
    free = learning_trajectory(config, sc, steps, collapse_draw=math.inf)
    cum, total = [], 0.0
    for h in free.hazard:
        total += h
        cum.append(total)
    finals: dict[int | None, float] = {}
    acc = 0.0
    for i in range(n_draws):
        draw = -math.log(1 - (i + 0.5) / n_draws)
        step = next((t for t, c in enumerate(cum, start=1) if c >= draw), None)
        if step not in finals:
            finals[step] = free.score[-1] if step is None else learning_trajectory(config, sc, steps, cum[step - 1]).score[-1]
        acc += finals[step]
    return acc / n_draws
