"""The simulator's pure core: (config, scenario, seed) -> a timed verl metric stream, and ground truths.

``simulate`` plays one trial: start-up, the step-0 validation, then every step's phases, in simulated
seconds, ending ``completed``, ``oom`` (a phase's memory passes the GPU's capacity) or ``failed`` (a
config verl refuses). ``ground_truth`` finds the best stage-1 config of a discretised system space by
exhaustive evaluation; ``ground_truth_learning`` does the same for the stage-2 knobs. No I/O here: the
runner (``mart.trial_runner.sim.runner``) turns a ``SimResult`` into files as simulated time passes.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import numpy as np

from mart.state.search_space import SearchSpace
from mart.trial_runner.sim import catalogue as C
from mart.trial_runner.sim import learning as L
from mart.trial_runner.sim import multi_agent as MA
from mart.trial_runner.sim import system as S
from mart.trial_runner.sim.grid import (
    ROLLOUT_GRID,
    SHARED,
    grid_columns,
    knobs_to_overrides,
    train_grid,
    valid_mask,
)
from mart.trial_runner.sim.scenarios import Scenario, get_scenario, load_scenario  # noqa: F401 - get_scenario: bench/compare.py
from mart.trial_runner.sim.trial import (
    LENGTH_NOISE,
    MEMORY_NOISE_GB,
    TIMING_NOISE,
    VAL_KEY,
    WARMUP_SLOWDOWN,
    SimEvent,
    SimResult,
    init_seconds,
    scalar,
    seed_hash,
)


def search_space(scenario: str | Scenario | None = None) -> SearchSpace:
    """verl's catalogue; a multi-agent scenario's own (per-agent and workflow knobs) when given one
    (``catalogue.search_space``; ``scenario`` may be a shipped name or a file)."""
    return C.search_space(None if scenario is None else load_scenario(scenario))


def base_config(scenario: str | Scenario) -> dict[str, Any]:
    """verl's defaults plus the scenario's job shape: the baseline of every stage (``catalogue.base_config``)."""
    return C.base_config(load_scenario(scenario))


def _workload(sc: Scenario, lk: L.LearningKnobs, mean_untrunc: float, uses_ref: bool) -> tuple[S.StepWorkload, float]:
    seqs = lk.train_batch * lk.n
    mean, std, longest, clip = L.length_stats(mean_untrunc, sc.resp_cv, lk.max_response_length, seqs)
    w = S.StepWorkload(
        seqs=seqs,
        n=lk.n,
        prompt_mean=sc.prompt_len_mean,
        prompt_max=min(sc.max_prompt_length, 3.5 * sc.prompt_len_mean),
        resp_mean=mean,
        resp_std=std,
        resp_max=longest,
        resp_mu=math.log(max(mean_untrunc, 1.0)) - math.log(1 + sc.resp_cv**2) / 2,
        resp_sigma=math.sqrt(math.log(1 + sc.resp_cv**2)),
        max_prompt_length=sc.max_prompt_length,
        max_response_length=lk.max_response_length,
        uses_ref=uses_ref,
        mini_batch=lk.mini_batch,
        ppo_epochs=lk.ppo_epochs,
        entropy_in_update=lk.entropy_coeff != 0,
    )
    return w, clip


def validation_seconds(sc: Scenario, k: dict[str, float], w: S.StepWorkload) -> float:
    """One validation pass: generate one response per validation prompt, then score it."""
    val_w = S.StepWorkload(**{**w.__dict__, "n": 1})
    return scalar(S.rollout_phase(sc, k, val_w, seqs=sc.val_size)["t_gen"]) + 0.3 + sc.val_size * 0.4e-3


def simulate(
    config: dict[str, Any],
    scenario: str | Scenario,
    steps: int,
    seed: int = 0,
    memory_capacity_gb: float | None = None,
    start: dict[str, Any] | None = None,
    save_steps: tuple[int, ...] | list[int] = (),
) -> SimResult:
    """Play one trial of ``steps`` steps of ``config`` (a full flat verl config) on ``scenario``.

    ``save_steps``: global steps whose learning state goes to ``SimResult.checkpoints`` (a checkpoint).
    ``start``: such a saved learning state; the trial then plays
    global steps ``start["step"]+1 .. steps`` from it (a branch), keeping the parent's collapse draw.
    """
    sc = load_scenario(scenario)
    if memory_capacity_gb is not None:
        sc = sc.with_memory(memory_capacity_gb)
    if MA.is_multi_agent(sc):
        return MA.simulate(config, sc, steps, seed=seed, start=start, save_steps=save_steps)
    n_gpus = sc.n_gpus
    errors = search_space().check_constraints(config)
    if errors:
        return SimResult([], "failed", "config rejected: " + " ".join(errors), 8.0, 0, n_gpus, 0.0, steps)

    k = S.knobs_from_config(config)
    lk = L.LearningKnobs.from_config(config, sc)
    uses_ref = lk.use_kl or bool(config.get("algorithm.use_kl_in_reward", False))
    learn_hash = seed_hash(C.learning_part(config))
    first = 1 if start is None else int(start["step"]) + 1
    branch = () if start is None else ("branch", first)
    rng_learn = np.random.default_rng(seed_hash("learn", seed, learn_hash, sc.name, *branch))
    rng_sys = np.random.default_rng(seed_hash("sys", seed, config, sc.name, *branch))
    collapse_draw = float(rng_learn.exponential(1.0))
    if start is not None:  # the run's fate carries over: the same threshold, the hazard accumulated so far
        collapse_draw = float(start["collapse_draw"])
    traj = L.learning_trajectory(config, sc, steps, collapse_draw, start=start)
    val_sigma = 0.05 * sc.learning.headroom + 0.0015

    events: list[SimEvent] = []
    t = init_seconds(sc, k)
    init_s = t
    capacity = sc.gpu.memory_gb
    test_freq = int(config.get("trainer.test_freq", sc.test_freq) or -1)

    def val_metrics(score: float) -> dict[str, float]:
        noisy = float(np.clip(score + rng_learn.normal(0, val_sigma), 0, 1))
        out = {VAL_KEY: noisy}
        for name, mult in sc.val_benchmarks:
            out[f"val-aux/{name}/reward/mean@1"] = float(np.clip(noisy * mult + rng_learn.normal(0, 2 * val_sigma), 0, 1))
        return out

    w1, _ = _workload(sc, lk, traj.resp_mean_untruncated[0] if traj.score else sc.learning.resp_len0, uses_ref)
    t_val = validation_seconds(sc, k, w1)
    info: dict[str, Any] = {"collapse_step": traj.collapse_step, "collapse_kind": traj.collapse_kind, "x": traj.x}

    # vLLM reserves its pool when it starts: an over-committed rollout fails before step 1
    start = S.rollout_phase(sc, k, w1)
    if bool(np.asarray(start["kv_fail"])):
        reason = (f"vLLM: no memory left for the KV cache (budget {k['util'] * capacity:.1f} GiB, "
                  f"KV pool {scalar(start['kv_pool_gb']):.1f} GiB): raise gpu_memory_utilization or TP")
        return SimResult([], "oom", reason, t * 0.8, 0, n_gpus, init_s, steps, info)

    if config.get("trainer.val_before_train", True):
        t += t_val
        events.append(SimEvent(t, first - 1, {**val_metrics(traj.score0), "timing_s/testing": t_val}))
    checkpoints = {int(st): traj.state_at(int(st)) for st in save_steps if first <= int(st) <= steps}

    for step in range(first, steps + 1):
        lens_noise = float(np.exp(rng_learn.normal(0, LENGTH_NOISE)))
        i = step - first
        w, clip = _workload(sc, lk, traj.resp_mean_untruncated[i] * lens_noise, uses_ref)
        o = S.simulate_step(sc, k, w)
        slow = WARMUP_SLOWDOWN.get(step, 1.0)
        phases = {}
        for name, key in (("gen", "t_gen"), ("old_log_prob", "t_old"), ("ref", "t_ref"), ("update_actor", "t_update"),
                          ("update_weights", "t_weights"), ("reward", "t_reward"), ("adv", "t_adv")):
            phases[name] = scalar(o[key]) * slow * float(np.exp(rng_sys.normal(0, TIMING_NOISE * sc.noise_scale)))
        mems = {
            "gen": scalar(o["mem_gen"]),
            "old_log_prob": scalar(o["mem_old"]),
            "ref": scalar(o["mem_ref"]),
            "update_actor": scalar(o["mem_update"]),
        }
        mems = {p: m + float(rng_sys.normal(0, MEMORY_NOISE_GB)) if m > 0 else 0.0 for p, m in mems.items()}
        # a phase whose memory passes the capacity dies with CUDA OOM after the phases before it
        elapsed = 0.0
        for phase in ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"):
            if mems.get(phase, 0.0) > capacity:
                reason = (f"CUDA out of memory in {phase} at step {step}: needs {mems[phase]:.1f} GiB of "
                          f"{capacity:.0f} GiB (mean response {w.resp_mean:.0f} tokens)")
                return SimResult(events, "oom", reason, t + elapsed + 0.5 * phases[phase], step - 1, n_gpus, init_s, steps, info,
                                 {c: v for c, v in checkpoints.items() if c < step})
            elapsed += phases[phase]
        if not uses_ref:
            phases.pop("ref")
        step_s = sum(phases.values())
        tokens = w.tokens
        peak = max(mems.values())
        data: dict[str, float] = {f"timing_s/{p}": v for p, v in phases.items()}
        gen_tokens = w.seqs * w.resp_mean
        data.update(
            {
                "timing_s/step": step_s,
                "timing_per_token_ms/gen": 1000 * phases["gen"] / gen_tokens,
                "timing_per_token_ms/update_actor": 1000 * phases["update_actor"] / tokens,
                "perf/total_num_tokens": tokens,
                "perf/time_per_step": step_s,
                "perf/throughput": tokens / (step_s * n_gpus),
                "perf/mfu/actor": scalar(o["mfu"]),
                "perf/max_memory_allocated_gb": peak,
                "perf/max_memory_reserved_gb": peak + 0.8,
                "perf/cpu_memory_used_gb": 60 + 40 * (k["param_off"] + k["opt_off"]) * sc.model.params / 8e9,
                "sim/memory/gen_gb": mems["gen"],
                "sim/memory/old_log_prob_gb": mems["old_log_prob"],
                "sim/memory/update_actor_gb": mems["update_actor"],
                "sim/rollout/concurrency": scalar(o["concurrency"]),
                "sim/rollout/kv_cache_gb": scalar(o["kv_pool_gb"]),
                "training/global_step": float(step),
                "training/epoch": 0.0,
            }
        )
        if uses_ref:
            data["timing_per_token_ms/ref"] = 1000 * phases["ref"] / tokens
            data["sim/memory/ref_gb"] = mems["ref"]
        noise = lambda sigma: float(np.exp(rng_learn.normal(0, sigma)))
        reward = float(np.clip(traj.reward[i] + rng_learn.normal(0, 0.01), 0, 1))
        data.update(
            {
                "actor/entropy": traj.entropy[i] * noise(0.03),
                "actor/ppo_kl": traj.ppo_kl[i] * noise(0.2),
                "actor/pg_clipfrac": traj.pg_clipfrac[i] * noise(0.15),
                "actor/pg_loss": float(rng_learn.normal(0, 0.01)),
                "actor/grad_norm": traj.grad_norm[i] * noise(0.15),
                "actor/lr": traj.lr[i],
                "critic/score/mean": reward,
                "critic/score/max": 1.0,
                "critic/score/min": 0.0,
                "critic/rewards/mean": reward,
                "response_length/mean": w.resp_mean,
                "response_length/max": w.resp_max,
                "response_length/min": 1.0 + 0.02 * w.resp_mean,
                "response_length/clip_ratio": clip,
                "prompt_length/mean": sc.prompt_len_mean,
                "prompt_length/max": w.prompt_max,
                "prompt_length/clip_ratio": 0.0,
                "global_seqlen/mean": tokens / n_gpus,
            }
        )
        if lk.use_kl:
            data["actor/kl_loss"] = traj.kl_loss[i] * noise(0.1)
        t += step_s
        if test_freq > 0 and (step % test_freq == 0 or step == steps):
            w_val, _ = _workload(sc, lk, traj.resp_mean_untruncated[i], uses_ref)
            tv = validation_seconds(sc, k, w_val)
            t += tv
            data.update(val_metrics(traj.score[i]))
            data["timing_s/testing"] = tv
        events.append(SimEvent(t, step, data))
    return SimResult(events, "completed", None, t, steps, n_gpus, init_s, steps, info, checkpoints)


OOM_Z = 2.0
"""How many standard deviations of a step's draws (response lengths, memory) a schedule's expected peak must
leave below the capacity to count as one that runs (``schedule_oom``): a run of tens of steps draws each step
anew, so a schedule whose expected peak sits at the capacity runs out of memory in about half of its runs."""


def schedule_oom(segments: list[L.Segment], scenario: str | Scenario, total_steps: int,
                 z: float = OOM_Z) -> str | None:
    """Why a schedule would not run to ``total_steps`` on ``scenario`` (a config verl refuses, vLLM's pool
    over-committed at a segment's start, or a phase's memory over the GPU's capacity at some step, with
    ``z`` standard deviations of the per-step draws of ``simulate``), None when it runs. The same memory model
    ``simulate`` plays, at the collapse-free trajectory's response lengths: what a noise-free reference must
    price, since an OOM'd segment leaves no checkpoint and scores nothing. Multi-agent scenarios: None (not
    modelled here)."""
    sc = load_scenario(scenario)
    if MA.is_multi_agent(sc):
        return None
    segs = L.check_segments(segments, total_steps)
    capacity = sc.gpu.memory_gb
    len_mult = math.exp(z * LENGTH_NOISE)
    for (a, _b, cfg), traj in zip(segs, L.schedule_trajectory(segs, sc, total_steps, math.inf)):
        errors = search_space().check_constraints(cfg)
        if errors:
            return f"config rejected at step {a + 1}: " + " ".join(errors)
        k = S.knobs_from_config(cfg)
        lk = L.LearningKnobs.from_config(cfg, sc)
        uses_ref = lk.use_kl or bool(cfg.get("algorithm.use_kl_in_reward", False))
        w1, _ = _workload(sc, lk, traj.resp_mean_untruncated[0], uses_ref)
        if bool(np.asarray(S.rollout_phase(sc, k, w1)["kv_fail"])):
            return f"vLLM: no memory left for the KV cache at step {a + 1}"
        for i, resp in enumerate(traj.resp_mean_untruncated):
            w, _ = _workload(sc, lk, resp * len_mult, uses_ref)
            o = S.simulate_step(sc, k, w)
            for phase, key in (("gen", "mem_gen"), ("old_log_prob", "mem_old"), ("ref", "mem_ref"),
                               ("update_actor", "mem_update")):
                need = scalar(o[key])
                if need > 0 and need + z * MEMORY_NOISE_GB > capacity:
                    return (f"out of memory in {phase} at step {traj.first_step + i}: {need:.1f} GiB expected of "
                            f"{capacity:.0f} GiB")
    return None


def window_workloads(sc: Scenario, config: dict[str, Any], horizon: int) -> list[S.StepWorkload]:
    """Noise-free workloads of the throughput window's steps (updates 3-5)."""
    from mart.state.objectives import throughput_window

    first, last = throughput_window(horizon)
    lk = L.LearningKnobs.from_config(config, sc)
    traj = L.learning_trajectory(config, sc, last, collapse_draw=math.inf)
    uses_ref = lk.use_kl
    return [_workload(sc, lk, traj.resp_mean_untruncated[s - 1], uses_ref)[0] for s in range(first, last + 1)]


def expected_throughput(config: dict[str, Any], scenario: str | Scenario, horizon: int = 6,
                        memory_capacity_gb: float | None = None) -> tuple[float, float]:
    """Noise-free (mean throughput over the window, peak memory over it) of a full config."""
    sc = load_scenario(scenario)
    if memory_capacity_gb is not None:
        sc = sc.with_memory(memory_capacity_gb)
    if MA.is_multi_agent(sc):
        return MA.expected_throughput(config, sc, horizon)
    k = S.knobs_from_config(config)
    thr, peak = [], 0.0
    for w in window_workloads(sc, config, horizon):
        o = S.simulate_step(sc, k, w)
        thr.append(scalar(o["throughput"]))
        peak = max(peak, scalar(o["peak_gb"]))
    return float(np.mean(thr)), peak


def ground_truth(scenario: str | Scenario, margin: float = 0.1, horizon: int = 6, memory_capacity_gb: float | None = None,
                 top_k: int = 64) -> dict[str, Any]:
    """The best stage-1 config of the discretised system space (noise-free), by exhaustive evaluation.

    Rollout knobs (``ROLLOUT_GRID``) and training knobs (``TRAIN_*``) are evaluated on their full grids for
    every combination of the knobs they share (offloads, free_cache_engine); the throughput of a pair is
    exact, and the pairs compared are the ``top_k`` fastest feasible of each side (the step time is their
    sum, so the best pair is among them unless the per-step window reorders them, which it does not here).
    Feasible = no vLLM KV failure, every phase's peak within ``(1 - margin) x capacity``, verl's
    constraints hold.

    Returns:
        dict with ``throughput``, ``overrides`` (vs ``base_config``), ``peak_memory_gb``, ``baseline_throughput``,
        ``baseline_peak_memory_gb``, ``gain_pct``, ``limit_gb``, ``evaluated`` (grid points), ``config`` (the
        optimum's full config: ``base_config`` plus ``overrides``).

    The log-prob passes' token caps (``rollout/ref.log_prob_max_token_len_per_gpu``) are not catalogue
    knobs: as in verl, they follow the actor's ``ppo_max_token_len_per_gpu`` (its yaml interpolates them)
    unless the scenario's base config sets them - so the grid holds exactly what a tuner can express.
    """
    sc = load_scenario(scenario)
    if memory_capacity_gb is not None:
        sc = sc.with_memory(memory_capacity_gb)
    if MA.is_multi_agent(sc):
        return dict(MA.ground_truth(sc, margin, horizon, top_k))
    return dict(_ground_truth(sc, margin, horizon, top_k))


@functools.lru_cache(maxsize=32)
def _ground_truth(sc: Scenario, margin: float, horizon: int, top_k: int) -> dict[str, Any]:
    cfg0 = base_config(sc)
    limit = (1 - margin) * sc.gpu.memory_gb
    k0 = S.knobs_from_config(cfg0)
    wls = window_workloads(sc, cfg0, horizon)
    n_gpus = sc.n_gpus
    tokens = np.array([w.tokens for w in wls])

    space = search_space()
    rgrid = grid_columns(ROLLOUT_GRID)
    r_valid = valid_mask(space, rgrid, ["mnbt", "chunked", "tp"], cfg0)
    tgrid = train_grid(k0, cfg0)
    t_valid = valid_mask(space, tgrid, ["dyn", "ppo_micro", "lp_micro", "tok_cap", "sp", "remove_pad"], cfg0)
    evaluated = 0
    best: dict[str, Any] = {"throughput": -1.0}
    for combo in itertools.product(*SHARED.values()):
        shared = dict(zip(SHARED, combo))
        kr = {**k0, **rgrid, **shared}
        kt = {**k0, **tgrid, **shared, "free_cache": 1.0}  # the kept KV pool is added per pair below
        g_time = np.zeros((len(wls), len(rgrid["util"])))
        t_time = np.zeros((len(wls), len(tgrid["dyn"])))
        r_mem = np.zeros(len(rgrid["util"]))
        t_mem = np.zeros(len(tgrid["dyn"]))
        r_ok = r_valid.copy()
        for i, w in enumerate(wls):
            ro = S.rollout_phase(sc, kr, w)
            ov = S.step_overheads(sc, kr, w)
            g_time[i] = ro["t_gen"] + ov["t_weights"] + ov["t_reward"] + ov["t_adv"]
            r_mem = np.maximum(r_mem, ro["mem_gen"])
            r_ok &= ~np.asarray(ro["kv_fail"])
            tr = S.train_phases(sc, kt, w)
            t_time[i] = tr["t_old"] + tr["t_ref"] + tr["t_update"]
            t_mem = np.maximum.reduce([t_mem, tr["mem_old"], tr["mem_ref"], tr["mem_update"]])
        evaluated += r_mem.size + t_mem.size
        r_ok &= r_mem <= limit
        kept = (1 - shared["free_cache"]) * rgrid["util"] * sc.gpu.memory_gb
        t_ok = t_valid & (t_mem <= limit)
        if not r_ok.any() or not t_ok.any():
            continue
        r_idx = np.flatnonzero(r_ok)
        r_idx = r_idx[np.argsort(g_time[:, r_idx].sum(0))[:top_k]]
        if shared["free_cache"]:
            t_idx = np.flatnonzero(t_ok)
            t_idx = t_idx[np.argsort(t_time[:, t_idx].sum(0))[:top_k]]
        else:  # the training side must also leave room for the kept pool: keep the fastest per budget
            t_idx = np.flatnonzero(t_ok)
            order = np.argsort(t_time[:, t_idx].sum(0))
            t_idx = t_idx[order[: top_k * 8]]
        step = g_time[:, r_idx][:, :, None] + t_time[:, t_idx][:, None, :]
        thr = (tokens[:, None, None] / (step * n_gpus)).mean(0)
        pair_ok = (t_mem[t_idx][None, :] + kept[r_idx][:, None]) <= limit
        thr = np.where(pair_ok, thr, -1.0)
        i, j = np.unravel_index(int(np.argmax(thr)), thr.shape)
        if thr[i, j] > best["throughput"]:
            ri, ti = r_idx[i], t_idx[j]
            knobs = {**{n: float(rgrid[n][ri]) for n in rgrid}, **{n: float(tgrid[n][ti]) for n in tgrid}, **shared}
            peak = max(float(r_mem[ri]), float(t_mem[ti] + kept[ri]))
            best = {"throughput": float(thr[i, j]), "knobs": knobs, "peak_memory_gb": peak}
    base_thr, base_peak = expected_throughput(cfg0, sc, horizon)
    full = {**cfg0, **knobs_to_overrides(best.get("knobs", {}))}
    overrides = {k: v for k, v in full.items() if cfg0.get(k) != v}
    if not full.get("actor_rollout_ref.actor.use_dynamic_bsz"):
        overrides.pop("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", None)
    else:
        for key in ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"):
            overrides.pop(key, None)
    if not full.get("actor_rollout_ref.actor.use_kl_loss"):
        overrides.pop("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", None)
    return {
        "scenario": sc.name,
        "config": {**cfg0, **overrides},
        "throughput": best["throughput"],
        "overrides": overrides,
        "peak_memory_gb": best.get("peak_memory_gb"),
        "baseline_throughput": base_thr,
        "baseline_peak_memory_gb": base_peak,
        "gain_pct": 100 * (best["throughput"] / base_thr - 1),
        "limit_gb": limit,
        "evaluated": evaluated,
    }


LEARNING_GRID: dict[str, list[Any]] = {
    "actor_rollout_ref.actor.optim.lr": [3e-7, 1e-6, 2e-6, 3e-6, 5e-6, 7e-6, 1e-5, 2e-5],
    "actor_rollout_ref.actor.use_kl_loss": [False, True],
    "actor_rollout_ref.actor.kl_loss_coef": [0.001, 0.01],
    "actor_rollout_ref.actor.entropy_coeff": [0.0, 0.001],
    "actor_rollout_ref.actor.clip_ratio_high": [0.2, 0.28],
    "actor_rollout_ref.rollout.temperature": [0.8, 1.0, 1.2],
    "actor_rollout_ref.actor.ppo_mini_batch_size": [64, 128, 256],
}


def ground_truth_learning(scenario: str | Scenario, horizon: int = 30) -> dict[str, Any]:
    """Best expected (noise-free) final validation score over ``LEARNING_GRID`` (see ``_ground_truth_learning``;
    a multi-agent scenario: ``multi_agent.ground_truth_learning``)."""
    sc = load_scenario(scenario)
    if MA.is_multi_agent(sc):
        return dict(MA.ground_truth_learning(sc, horizon))
    return dict(_ground_truth_learning(sc, horizon))


def expected_score(config: dict[str, Any], scenario: str | Scenario, horizon: int) -> float:
    """Expected (noise-free) final validation score of a full config: the team's for a multi-agent scenario."""
    sc = load_scenario(scenario)
    if MA.is_multi_agent(sc):
        return MA.expected_team_score(config, sc, horizon)
    return L.final_score_noise_free(config, sc, horizon)


@functools.lru_cache(maxsize=32)
def _ground_truth_learning(sc: Scenario, horizon: int = 30) -> dict[str, Any]:
    """Best expected (noise-free) final validation score over ``LEARNING_GRID``.

    The grid covers the knobs with the largest effects (warm-up, weight decay, clip_grad, top_p and the
    loss aggregation move the score little); n, batch and response length stay at the scenario's (they
    change the step's cost, which stage 2 does not price).
    """
    cfg0 = base_config(sc)
    base = L.final_score_noise_free(cfg0, sc, horizon)
    best_score, best_over = -1.0, {}
    keys = list(LEARNING_GRID)
    for values in itertools.product(*LEARNING_GRID.values()):
        over = dict(zip(keys, values))
        if not over["actor_rollout_ref.actor.use_kl_loss"] and over["actor_rollout_ref.actor.kl_loss_coef"] != 0.001:
            continue
        s = L.final_score_noise_free({**cfg0, **over}, sc, horizon)
        if s > best_score:
            best_score, best_over = s, over
    return {"scenario": sc.name, "score": best_score, "overrides": {k: v for k, v in best_over.items() if cfg0.get(k) != v},
            "baseline_score": base, "gain": best_score - base}
