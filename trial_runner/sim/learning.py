"""Learning model: stage-2 knobs -> per-step validation score, reward, entropy, KL, grad norm, lengths.

A deliberately simple, smooth response surface with the qualitative shape reported for GRPO on LLMs
(see ``docs/sim.md``, "Learning model", for every term and its source):

* progress per step grows with the normalised step size ``x = lr / lr_opt * sqrt(updates per step) ...``
  up to ``x = 1`` and only logarithmically beyond, while a quadratic-in-log penalty costs final quality;
* exploration fuels progress: entropy decays with progress (faster at low temperature, slower with
  clip-higher or an entropy bonus), and progress slows with sqrt(entropy / entropy at step 1);
* a collapse hazard grows as ``(x / x_c)^4``; a KL loss raises ``x_c`` ("no KL with high lr" collapses);
  collapse time = first step where the cumulative hazard passes an Exp(1) draw of the seed;
* after a collapse the validation score falls toward a third of its start, entropy and grad norm blow
  up, and responses run to the length limit (repetition) -- the health monitor's signals.

Path-consistent (issue 13, docs/sim.md "Schedules"): every knob-dependent term acts per step and
accumulates into the learning state a checkpoint holds, so a branch's new knobs change only what follows
the branch point, and a static config plays exactly as it did before schedules existed.

Pure: ``learning_trajectory(config, scenario, steps, collapse_draw, start=checkpoint)`` returns the
noise-free series; ``schedule_score_noise_free(segments, scenario, total_steps)`` a schedule's expected score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from mart.state.verl_keys import ACTOR as A
from mart.state.verl_keys import ROLLOUT as R
from mart.trial_runner.sim.job import Scenario

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


#: POLARIS searches the training temperature before each stage for the rollouts' diversity, and the temperature
#: found rises as the policy sharpens: Qwen3-4B trained at 1.4 -> 1.45 -> 1.5 over its three stages, raised by an
#: interval set by the previous stage's entropy drop, 0.05 after a slight one (hkunlp.github.io/blog/2025/Polaris;
#: the README of github.com/ChenxinAn-fdu/POLARIS). The quality's temperature optimum therefore follows the
#: policy's own entropy ratio r (its entropy now / at the start, at a fixed temperature): T* = r^-0.1, i.e. +0.05
#: after a 40% fall and +0.13 after Cui et al.'s 73% (a larger step after a larger drop, as POLARIS does). A fixed
#: temperature is right at the start and too cold once entropy has fallen. 0 = the pre-issue-24 fixed optimum 1.0.
TEMP_SHARPEN = 0.1
TEMP_OPT_RANGE = (0.6, 1.6)


def temperature_optimum(sharpness: float) -> float:
    """The sampling temperature the per-step quality peaks at, for a policy whose own entropy is ``sharpness``
    x its starting entropy (POLARIS: the temperature that keeps rollouts diverse rises as the policy sharpens)."""
    t_opt = max(sharpness, 1e-6) ** -TEMP_SHARPEN
    return min(TEMP_OPT_RANGE[1], max(TEMP_OPT_RANGE[0], t_opt))


def temperature_quality(t: float, t_opt: float = 1.0) -> float:
    """The temperature's factor of the per-step learning quality: 1 at ``t_opt``, narrower above it (noisy
    samples) than below it (too little exploration); ``t_opt`` = 1.0 at the start (Skywork-OR1: 1.0 > 0.6)."""
    return math.exp(-(((t - t_opt) / 0.35) ** 2)) if t >= t_opt else math.exp(-(((t_opt - t) / 0.5) ** 2))


def _quality(k: LearningKnobs) -> float:
    """The knobs' factor of the per-step learning quality, the temperature's excepted (``temperature_quality``
    moves with the policy's entropy)."""
    q_n = 1 - math.exp(-(k.n - 1) / 3.5)
    q_p = 1 - 0.5 * (1 - k.top_p) ** 2
    q_clip = 1 + 0.06 * min(1.0, max(0.0, k.clip_high - k.clip_low) / 0.08)
    q_clip *= 1 - 0.5 * max(0.0, 0.1 - k.clip_low)  # too narrow a lower clip stalls updates
    q_agg = AGG_QUALITY.get(k.loss_agg, 0.95)
    q_norm = 1.0 if k.norm_adv else 1.01
    q_wd = 1 - max(0.0, k.weight_decay - 0.1)
    q_kl = 1 / (1 + k.kl_coef / 0.02) if k.use_kl else 1.0
    e = k.entropy_coeff
    q_ent = 1 + 0.04 * min(1.0, e / 0.001) - 8 * max(0.0, e - 0.002)
    return q_n * q_p * q_clip * q_agg * q_norm * q_wd * q_kl * q_ent


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


#: arXiv 2602.01826 (Zhang, Li et al., "Beyond Precision: Training-Inference Mismatch is an Optimization Problem
#: and Simple LR Scheduling Fixes It"): gradient noise and the training-inference mismatch escalate together as
#: training progresses, a surge in response length is the early warning of the instability, and shrinking the
#: update size suppresses it. The collapse hazard of a step is therefore scaled by the policy's mean response
#: length relative to its start, to this power (1 = in proportion; 0 = the pre-issue-24 constant hazard): the same
#: lr that is safe early is riskier late, and a later segment with a smaller lr stops the growth.
LATE_HAZARD = 1.0

#: entropy rises toward a raised plateau (clip-higher switched on after the fall) this much slower than it
#: falls toward a lower one - an assumption: the public runs (DAPO, Skywork-OR1) show clip-higher or an
#: entropy bonus *holding* entropy, and a bonus *raising* it, not how fast a collapsed policy spreads again
ENT_RISE = 1 / 3
STATE_VERSION = 2


@dataclass(frozen=True)
class KnobTerms:
    """Everything the per-step update takes from one config's knobs (constant within a segment)."""

    x: float  # normalised step size at the full learning rate
    quality: float  # multiplies each step's learning increment (times ``temperature_quality`` of the step)
    temperature: float  # the sampling temperature (its quality factor follows the policy's entropy)
    penalty: float  # share of each step's increment lost to overshooting (x > 1)
    xc: float  # collapse threshold of the step size
    hz_mult: float
    data_rate: float
    warmup_ratio: float
    decay: float  # entropy pressure per unit of progress
    plateau: float  # where the fast entropy drop levels off (share of the start)
    slow: float  # slow entropy decline per unit of pressure after the drop
    ent_growth: float  # log-entropy growth per step from a large entropy bonus
    ent_sampling: float  # sampling entropy of the base model with these rollout knobs (T, top-p)
    ent_cap: float
    length_gain: float  # response-length growth at saturation, share of the starting length
    lr: float


def knob_terms(k: LearningKnobs, sc: Scenario) -> KnobTerms:
    # entropy pressure per unit of progress (1 at verl's defaults): faster at low temperature and top-p,
    # slower with clip-higher, an entropy bonus or a KL loss anchoring the policy to the reference
    clip_higher = min(1.0, max(0.0, k.clip_high - k.clip_low) / 0.08)
    decay = (1 / max(k.temperature, 0.05)) ** 2
    decay /= 1 + 0.5 * clip_higher
    decay /= 1 + k.entropy_coeff / 0.0015
    decay /= 0.6 + 0.4 * k.top_p
    if k.use_kl:
        decay /= 1 + k.kl_coef / 0.005
    x = _aggressiveness(k, sc)
    ent1 = sc.learning.entropy0 * k.temperature * (0.7 + 0.3 * k.top_p)
    return KnobTerms(
        x=x, quality=_quality(k), temperature=k.temperature, penalty=0.25 * max(0.0, math.log(max(x, 1e-12))) ** 2, xc=_collapse_threshold(k),
        hz_mult=KL_TYPE_HAZARD.get(k.kl_type, 1.0) if k.use_kl else 1.0,
        data_rate=(k.train_batch / sc.train_batch_size) ** 0.25, warmup_ratio=k.warmup_ratio, decay=decay,
        # two phases (Cui et al. 2025): a fast early drop to a plateau, then a slow decline toward zero;
        # clip-higher raises the plateau and all but stops the decline (DAPO)
        plateau=ENT_PLATEAU + 0.3 * clip_higher, slow=ENT_SLOW * (1 - 0.9 * clip_higher),
        ent_growth=max(0.0, k.entropy_coeff - 0.003) * 20,  # a big entropy bonus inflates entropy
        ent_sampling=ent1,
        ent_cap=min(ENT_RUNAWAY * ent1, 0.5 * math.log(sc.model.vocab)),  # a runaway saturates well below ln(vocab)
        length_gain=sc.learning.resp_growth * AGG_LENGTH.get(k.loss_agg, 1.0), lr=k.lr,
    )


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


def _initial_state(kt: KnobTerms, sc: Scenario, horizon: int, collapse_draw: float) -> dict[str, Any]:
    return {"version": STATE_VERSION, "step": 0, "progress": 0.0, "pressure": 0.0, "log_growth": 0.0,
            "ent_fast": 1.0, "ent_slow_log": 0.0, "gain_acc": 0.0, "len_acc": 0.0, "exhausted_steps": 0,
            "exhausted_at": None, "cum_hazard": 0.0, "collapse_step": None, "collapse_kind": None,
            "s_pre": sc.learning.score0, "ent_pre": kt.ent_sampling, "ent1": kt.ent_sampling,
            "ent_ref": kt.ent_sampling, "score": sc.learning.score0, "collapse_draw": collapse_draw, "horizon": horizon}


def _upgrade_state(start: dict[str, Any], kt: KnobTerms, sc: Scenario, horizon: int) -> dict[str, Any]:
    """A checkpoint written before the state was path-consistent (no accumulators): rebuilt as if the
    parent had run the branch's knobs - what that simulator assumed when it branched."""
    if int(start.get("version", 1)) >= STATE_VERSION:
        return dict(start)
    p, step = float(start["progress"]), int(start["step"])
    pressure = float(start["pressure"])
    ex = start.get("exhausted_at")
    return {**start, "version": STATE_VERSION, "ent_fast": kt.plateau + (1 - kt.plateau) * math.exp(-pressure / ENT_FAST),
            "ent_slow_log": -kt.slow * pressure,
            "gain_acc": kt.quality * temperature_quality(kt.temperature) * (1 - min(0.9, kt.penalty))
            * (1 - math.exp(-p / sc.learning.tau_steps)),
            "len_acc": kt.length_gain * (1 - math.exp(-p / 30.0)),
            "exhausted_steps": 0 if ex is None else step - int(ex) + 1, "ent_ref": start["ent1"], "horizon": horizon}


def learning_trajectory(config: dict[str, Any], sc: Scenario, steps: int, collapse_draw: float,
                        start: dict[str, Any] | None = None, horizon: int | None = None) -> LearningTrajectory:
    """The noise-free learning dynamics over global steps ``start_step+1 .. steps``.

    Path-consistent: every term that depends on the knobs acts on the step it is applied to and
    accumulates into the learning state (progress, the quality-weighted gain, the entropy's components,
    response-length growth, exhaustion, collapse hazard), so a trajectory played in segments from
    checkpoints with unchanged knobs equals the one played in one go, and a branch's new knobs change
    only what happens from the branch point on (docs/sim.md, "Schedules").

    Args:
        collapse_draw: the Exp(1) threshold the cumulative collapse hazard must pass (``math.inf``: never;
            ``1.0``: the noise-free reference used by the ground truth).
        start: a learning state from ``LearningTrajectory.states`` (a checkpoint): the trajectory continues
            from it under ``config``'s knobs (a branch) instead of starting from the base model.
        horizon: the training length the learning-rate warm-up is a share of (verl's total training
            steps); default ``steps``, the trial's last global step, which is what the backends pass as
            ``trainer.total_training_steps`` to a trial, resumed or not.
    """
    k = LearningKnobs.from_config(config, sc)
    lp = sc.learning
    kt = knob_terms(k, sc)
    out = LearningTrajectory([], lp.score0, [], [], [], [], [], [], [], [], None, None, kt.x, kt.quality)
    if start is None:
        st = _initial_state(kt, sc, int(horizon or steps), collapse_draw)
    else:  # a branch: the accumulated state carries over (and the parent's collapse, if any)
        st = _upgrade_state(start, kt, sc, int(horizon or steps))
        out.collapse_step, out.collapse_kind = st["collapse_step"], st["collapse_kind"]
        st["ent_pre"] = st["ent_pre"] * kt.ent_sampling / st["ent1"]  # sampling entropy follows T and top-p at once
        out.score0 = st["score"]
        st["horizon"] = int(horizon or steps)  # a resumed trial rebuilds its lr schedule from its own total steps
    progress, pressure, log_growth = st["progress"], st["pressure"], st["log_growth"]
    ent_fast, ent_slow_log, gain_acc, len_acc = st["ent_fast"], st["ent_slow_log"], st["gain_acc"], st["len_acc"]
    exhausted_steps, exhausted_at, cum_hazard = st["exhausted_steps"], st["exhausted_at"], st["cum_hazard"]
    s_pre, ent_pre, ent_ref = st["s_pre"], st["ent_pre"], st["ent_ref"]
    first = int(st["step"]) + 1
    out.first_step = first
    warm = kt.warmup_ratio * st["horizon"]
    net_quality = kt.quality * (1 - min(0.9, kt.penalty))  # the config's peak step size sets the overshoot
    # the temperature's quality factor depends on the policy's sharpness only: while the optimum stays at 1.0
    # (no entropy change yet, or TEMP_SHARPEN = 0) it is constant and computed once
    q_temp_fixed = temperature_quality(kt.temperature) if TEMP_SHARPEN == 0 else None
    updates = k.updates_per_step
    for t in range(first, steps + 1):
        ramp = min(1.0, t / warm) if warm >= 1 else 1.0
        xt = kt.x * ramp
        sharpness = min(ent_fast * math.exp(ent_slow_log + log_growth), kt.ent_cap / kt.ent_sampling)
        ent = kt.ent_sampling * sharpness
        ratio = ent / ent_ref  # exploration is measured against the run's start
        explore = math.sqrt(min(1.0, ratio))
        rel_len = 1 + len_acc  # the policy's mean response length relative to its start (untruncated)
        mean_len = lp.resp_len0 * rel_len
        clip = clip_ratio(mean_len, sc.resp_cv, k.max_response_length)
        step_speed = _speed(xt) * kt.data_rate
        before = progress
        progress += step_speed * explore * (1 - 0.6 * clip)
        d_pressure = kt.decay * step_speed
        pressure += d_pressure
        # the fast component relaxes toward the current plateau (slower when it has to rise), the slow
        # decline and a bonus's growth accumulate
        rate = 1.0 if ent_fast >= kt.plateau else ENT_RISE
        ent_fast = kt.plateau + (ent_fast - kt.plateau) * math.exp(-rate * d_pressure / ENT_FAST)
        ent_slow_log -= kt.slow * d_pressure
        log_growth += kt.ent_growth
        len_acc += kt.length_gain * (math.exp(-before / 30.0) - math.exp(-progress / 30.0))
        q_temp = q_temp_fixed if q_temp_fixed is not None else temperature_quality(
            kt.temperature, temperature_optimum(sharpness))
        gain_acc += net_quality * q_temp * (math.exp(-before / lp.tau_steps) - math.exp(-progress / lp.tau_steps))
        late = rel_len ** LATE_HAZARD if LATE_HAZARD else 1.0  # longer responses, noisier gradients (2602.01826)
        hazard = 0.5 * (xt / kt.xc) ** 6 * kt.hz_mult * late + 0.3 * max(0.0, ratio - 2.0) ** 2
        cum_hazard += hazard
        out.hazard.append(hazard)
        gain = lp.headroom * gain_acc
        gain -= lp.headroom * 0.6 * clip  # truncated answers score zero
        if ratio < 0.1:  # entropy exhausted: the policy stops improving and slowly degrades
            exhausted_at = exhausted_at or t
            exhausted_steps += 1
        if exhausted_steps:  # the loss stays when entropy is restored (a pass rate: bounded)
            gain -= lp.headroom * min(EXHAUSTION_MAX, 0.02 * (exhausted_steps - 1))
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
            ent = min(ent_pre * (1 + 4 * f), max(kt.ent_cap, ent_pre))
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
        out.states.append({"version": STATE_VERSION, "step": t, "progress": progress, "pressure": pressure,
                           "log_growth": log_growth, "ent_fast": ent_fast, "ent_slow_log": ent_slow_log,
                           "gain_acc": gain_acc, "len_acc": len_acc, "exhausted_steps": exhausted_steps,
                           "exhausted_at": exhausted_at, "cum_hazard": cum_hazard, "collapse_step": out.collapse_step,
                           "collapse_kind": out.collapse_kind, "s_pre": s_pre, "ent_pre": ent_pre,
                           "ent1": kt.ent_sampling, "ent_ref": ent_ref, "score": score,
                           "collapse_draw": collapse_draw,
                           "horizon": st["horizon"]})
    if out.collapse_step is None and out.entropy and out.entropy[-1] / ent_ref < 0.15:
        out.collapse_kind = "entropy"
    return out


Segment = tuple[int, int, dict[str, Any]]  # (from_step, to_step, full config): steps from_step+1 .. to_step


def check_segments(segments: list[Segment] | tuple[Segment, ...], total_steps: int) -> list[Segment]:
    """Segments sorted, contiguous from step 0 to ``total_steps``; ValueError otherwise."""
    segs = sorted(((int(a), int(b), cfg) for a, b, cfg in segments), key=lambda s: s[0])
    if not segs:
        raise ValueError("a schedule needs at least one segment")
    at = 0
    for a, b, _ in segs:
        if a != at or b <= a:
            raise ValueError(f"segments must be contiguous and non-empty from step 0: got ({a}, {b}) at step {at}")
        at = b
    if at != total_steps:
        raise ValueError(f"segments end at step {at}, not at total_steps={total_steps}")
    return segs


def schedule_trajectory(segments: list[Segment], sc: Scenario, total_steps: int,
                        collapse_draw: float) -> list[LearningTrajectory]:
    """A schedule played segment by segment, each branching from the previous segment's last state
    (as stage 3's trials do from checkpoints); the warm-up is a share of ``total_steps``."""
    out: list[LearningTrajectory] = []
    state = None
    for a, b, cfg in check_segments(segments, total_steps):
        traj = learning_trajectory(cfg, sc, b, collapse_draw, start=state, horizon=total_steps)
        out.append(traj)
        state = traj.state_at(b)
    return out


def schedule_score_noise_free(segments: list[Segment], sc: Scenario, total_steps: int, n_draws: int = 16) -> float:
    """Expected validation score at ``total_steps`` of a schedule, without measurement noise.

    ``segments`` = ``[(from_step, to_step, full_config), ...]``, contiguous from 0. As for a static config
    (``final_score_noise_free``, which equals this with one segment), the expectation is over ``n_draws``
    equally likely quantiles of the Exp(1) collapse threshold, the collapse step read from the
    schedule's collapse-free cumulative hazard.
    """
    free = schedule_trajectory(segments, sc, total_steps, math.inf)
    cum, total = [], 0.0
    for h in (h for traj in free for h in traj.hazard):
        total += h
        cum.append(total)
    finals: dict[int | None, float] = {}
    acc = 0.0
    for i in range(n_draws):
        draw = -math.log(1 - (i + 0.5) / n_draws)
        step = next((t for t, c in enumerate(cum, start=1) if c >= draw), None)
        if step not in finals:
            finals[step] = (free[-1].score[-1] if step is None
                            else schedule_trajectory(segments, sc, total_steps, cum[step - 1])[-1].score[-1])
        acc += finals[step]
    return acc / n_draws


def final_score_noise_free(config: dict[str, Any], sc: Scenario, steps: int, n_draws: int = 16) -> float:
    """Expected validation score after ``steps`` steps, without measurement noise.

    The collapse threshold is Exp(1)-distributed; the expectation averages the final score over
    ``n_draws`` equally likely quantiles of it (the pre-collapse dynamics do not depend on the draw, so
    each distinct collapse step is simulated once). A static config is a one-segment schedule.
    """
    return schedule_score_noise_free([(0, steps, config)], sc, steps, n_draws)
