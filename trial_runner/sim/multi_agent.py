"""Multi-agent scenarios of the simulator: a MARTI-style workflow of several trained agents (issue 14).

MARTI (ICLR 2026, github.com/TsinghuaC3I/MARTI) trains N LLM agents together by RL over a workflow (a
debate: every agent answers, sees the others' answers, answers again; a chain: one drafts, the next
revises) with a centralized verifier reward decomposed per agent by influence-aware shaping. This module
models such a job on top of the single-agent simulator, without changing it:

* **Each agent is one verl-style colocated GRPO worker group** (vLLM rollout + FSDP actor), described by
  the scenario's single-agent fields (model, GPUs per agent); the system knobs are shared by every agent
  (MARTI's ``--default_agent``), the learning knobs are per agent (``agents.<i>.<verl key>``).
* **Generation includes the rounds**: round r's prompt holds the question plus the previous rounds'
  answers of the agents shown (``max_others`` others, plus its own with ``contain_self``), so the prompt
  grows per round; a synchronous workflow waits for every agent at each round (a barrier).
* **Placement**: agents own their GPUs (one node per agent, the paper's setup: they run in parallel) or
  share them (they take turns, and each switch moves the sleeping agent's state to the host and back).
* **Async rollout** (``rollout.async_num_tasks``): MARTI's concurrent workflow tasks remove round
  barriers - calibrated to MARTI's figures (Chain-of-Agents 612.6 s -> 498.4 s, 8-round debate 3308 s ->
  ~2928 s at 512 workers) - and starve the engines when too few tasks run.
* **Learning**: every agent follows ``learning.learning_trajectory`` under its own knobs (its own collapse
  draw: one agent's collapse shows in its stream only); the team's score is a documented function of the
  agents' scores, the workflow and reward shaping (the paper's ablation: no shaping 45.6 -> 36.6).

The scenario type (``job.MultiAgentScenario``), its file schema (``scenarios``) and its knob catalogue
(``catalogue``: per-agent keys, workflow knobs, ``focus_space``) live below this module, so the loader and the
catalogue need nothing from here; the catalogue's names are re-exported. Every constant and its source is in
``docs/sim.md`` ("Multi-agent scenarios").
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mart.state.search_space import SearchSpace
from mart.state.verl_keys import ARR
from mart.trial_runner.sim import learning as L
from mart.trial_runner.sim import system as S
from mart.trial_runner.sim.catalogue import (
    ASYNC_KEY,
    HISTORY_SCOPE_KEY,
    HISTORY_SCOPES,
    MA_FOCUS,
    PER_AGENT_KEYS,
    ROUNDS_KEY,
    SHAPING_ALPHA_KEY,
    SHAPING_MODE_KEY,
    SHAPING_MODES,
    A,
    R,
    agent_config,
    agent_key,
    base_config,
    focus_space,
    learning_part,
    search_space,
)
from mart.trial_runner.sim.grid import (
    ROLLOUT_GRID,
    SHARED,
    grid_columns,
    knobs_to_overrides,
    train_grid,
    valid_mask,
)
from mart.trial_runner.sim.job import MultiAgentScenario, Scenario, is_multi_agent
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

# ------------------------------------------------------------------------------------------ system
#: MARTI's async-rollout figures at 512 workers: (sync s, async s, synchronous stages of the workflow)
ASYNC_CALIBRATION = {"chain": (612.6, 498.4, 3), "debate": (3308.0, 2928.0, 8)}
ASYNC_REF_TASKS = 512
ASYNC_HALF_TASKS = 64  # tasks at which half the barrier saving is realised


def async_gain_per_barrier(workflow: str) -> float:
    """Share of the synchronous generation time that one removable barrier costs, from MARTI's figures:
    saving = g x (1 - 1/stages) at 512 tasks (chain of 3 agents: 18.6%; 8-round debate: 11.5%)."""
    sync, asyn, stages = ASYNC_CALIBRATION[workflow]
    return (1 - asyn / sync) / (1 - 1 / stages) / _task_curve(ASYNC_REF_TASKS)


def _task_curve(c: Any) -> Any:
    c = np.asarray(c, dtype=float)
    return c / (c + ASYNC_HALF_TASKS)


def async_factor(sc: MultiAgentScenario, tasks: Any, stages: int) -> Any:
    """Multiplier of the synchronous generation time (barriers only) with ``tasks`` async tasks (0 = sync)."""
    if stages <= 1:
        return np.ones_like(np.asarray(tasks, dtype=float))
    return 1 - async_gain_per_barrier(sc.workflow) * (1 - 1 / stages) * _task_curve(tasks)


def stages_of(sc: MultiAgentScenario, rounds: int) -> int:
    return sc.num_agents if sc.workflow == "chain" else rounds


def round_prompts(sc: MultiAgentScenario, rounds: int, shown_len: float) -> list[float]:
    """Mean prompt length of each round (debate) or each agent in order (chain), untruncated."""
    stages = stages_of(sc, rounds)
    per = sc.shown_answers * (shown_len + sc.template_tokens)
    return [sc.prompt_len_mean + r * per for r in range(stages)]


@dataclass(frozen=True)
class AgentLengths:
    """One agent's response-length statistics in one step (truncated lognormal)."""

    mean: float
    std: float
    longest: float
    clip: float
    mu: float
    sigma: float


def agent_lengths(sc: Scenario, lk: L.LearningKnobs, mean_untrunc: float) -> AgentLengths:
    seqs = lk.train_batch * lk.n
    mean, std, longest, clip = L.length_stats(mean_untrunc, sc.resp_cv, lk.max_response_length, seqs)
    return AgentLengths(mean, std, longest, clip, math.log(max(mean_untrunc, 1.0)) - math.log(1 + sc.resp_cv**2) / 2,
                        math.sqrt(math.log(1 + sc.resp_cv**2)))


def _workload(sc: Scenario, lk: L.LearningKnobs, lens: AgentLengths, prompt_mean: float, seqs: int, uses_ref: bool
              ) -> S.StepWorkload:
    p = min(prompt_mean, sc.max_prompt_length)
    return S.StepWorkload(seqs=seqs, n=lk.n, prompt_mean=p, prompt_max=min(sc.max_prompt_length, p + 2.5 * sc.prompt_len_mean),
                          resp_mean=lens.mean, resp_std=lens.std, resp_max=lens.longest, resp_mu=lens.mu,
                          resp_sigma=lens.sigma, max_prompt_length=sc.max_prompt_length,
                          max_response_length=lk.max_response_length, uses_ref=uses_ref, mini_batch=lk.mini_batch,
                          ppo_epochs=lk.ppo_epochs, entropy_in_update=lk.entropy_coeff != 0)


@dataclass
class StepPlan:
    """What one multi-agent step processes: per stage (round) and agent, the rollout workload; per agent
    the training workload (all its rounds' samples)."""

    gen: list[list[S.StepWorkload]]  # [stage][agent] (chain: one agent per stage)
    gen_agent: list[list[int]]  # which agent generates in each entry
    train: list[S.StepWorkload]  # per agent
    stages: int
    tokens: float
    prompt_means: list[float]
    truncated: float  # share of the last stage's prompt cut by max_prompt_length


def step_plan(sc: MultiAgentScenario, config: dict[str, Any], lens_untrunc: list[float]) -> StepPlan:
    """The step's workloads for the agents' current (untruncated mean) response lengths."""
    rounds = int(config.get(ROUNDS_KEY, sc.num_rounds) or 1) if sc.workflow == "debate" else 1
    lks = [L.LearningKnobs.from_config(agent_config(config, i), sc) for i in range(sc.num_agents)]
    lens = [agent_lengths(sc, lks[i], lens_untrunc[i]) for i in range(sc.num_agents)]
    shown = float(np.mean([x.mean for x in lens]))
    prompts = round_prompts(sc, rounds, shown)
    stages = len(prompts)
    seqs = lks[0].train_batch * lks[0].n
    uses_ref = [lk.use_kl for lk in lks]
    gen, who = [], []
    for s, p in enumerate(prompts):
        agents = [s] if sc.workflow == "chain" else list(range(sc.num_agents))
        gen.append([_workload(sc, lks[i], lens[i], p, seqs, uses_ref[i]) for i in agents])
        who.append(agents)
    train = []
    tokens = 0.0
    for i in range(sc.num_agents):
        mine = [prompts[s] for s in range(stages) if i in who[s]]
        p_mean = float(np.mean([min(p, sc.max_prompt_length) for p in mine]))
        w = _workload(sc, lks[i], lens[i], p_mean, seqs * len(mine), uses_ref[i])
        train.append(replace(w, prompt_max=min(sc.max_prompt_length, max(mine) + 2.5 * sc.prompt_len_mean)))
        tokens += w.tokens
    truncated = float(truncation(sc, config, shown))
    return StepPlan(gen, who, train, stages, tokens, prompts, truncated)


def _capped(k: dict, tasks: Any, n: int, n_gpus: int) -> dict:
    """The knobs as the rollout sees them with ``tasks`` async tasks: each engine holds at most the
    sequences of the tasks it serves (a task = one prompt's group of n)."""
    engines = n_gpus / np.asarray(k["tp"], dtype=float)
    tasks = np.asarray(tasks, dtype=float)
    cap = np.where(tasks > 0, tasks * n / engines, np.inf)
    return {**k, "max_num_seqs": np.minimum(k["max_num_seqs"], np.maximum(cap, 1.0))}


def switch_seconds(sc: MultiAgentScenario, k: dict) -> Any:
    """Shared placement: per agent and step, its sleeping state (fp32 params + Adam, unless already
    offloaded) moves to the host and back (MARTI's vLLM/DeepSpeed sleep modes)."""
    if sc.placement != "shared":
        return 0.0
    resident = ((1 - k["param_off"]) * 4 + (1 - k["opt_off"]) * 8) * sc.model.params / sc.n_gpus_agent
    return sc.num_agents * (2 * resident / S.offload_bw(sc) + 2 * S.OFFLOAD_SYNC_S)


def gen_side(sc: MultiAgentScenario, k: dict, plan: StepPlan, tasks: Any) -> dict[str, Any]:
    """Generation of every stage (vectorised over the knobs): the stage's agents run in parallel on their
    own GPUs (own) or in turn (shared); a synchronous workflow waits for the slowest at each stage; async
    tasks remove part of that wait (``async_factor``) but cap each engine's sequences (``_capped``)."""
    combine = np.maximum if sc.placement == "own" else np.add
    t_gen, mem_gen, kv_fail, kv_pool, conc = 0.0, 0.0, False, None, None
    for ws in plan.gen:
        stage_t = None
        for w in ws:
            ro_mem = S.rollout_phase(sc, k, w)
            ro_t = S.rollout_phase(sc, _capped(k, tasks, w.n, sc.n_gpus_agent), w)
            stage_t = ro_t["t_gen"] if stage_t is None else combine(stage_t, ro_t["t_gen"])
            mem_gen = np.maximum(mem_gen, ro_mem["mem_gen"])
            kv_fail = np.logical_or(kv_fail, ro_mem["kv_fail"])
            kv_pool = ro_mem["kv_pool_gb"] if kv_pool is None else np.minimum(kv_pool, ro_mem["kv_pool_gb"])
            conc = ro_t["concurrency"] if conc is None else np.minimum(conc, ro_t["concurrency"])
        t_gen = t_gen + stage_t
    t_gen = t_gen * async_factor(sc, tasks, plan.stages)
    over = None
    for w in plan.train:  # weight sync, wake/sleep, reward, advantages: per agent
        ov = S.step_overheads(sc, k, w)
        t = ov["t_weights"] + ov["t_reward"] + ov["t_adv"]
        over = t if over is None else combine(over, t)
    if sc.placement == "shared":
        mem_gen = mem_gen + (sc.num_agents - 1) * S.CUDA_CONTEXT_GB  # the sleeping agents' CUDA contexts
    return {"t_gen": t_gen, "mem_gen": mem_gen, "kv_fail": kv_fail, "kv_pool_gb": kv_pool, "concurrency": conc,
            "t_over": over + switch_seconds(sc, k)}


def train_side(sc: MultiAgentScenario, k: dict, plan: StepPlan) -> dict[str, Any]:
    """old_log_prob, ref and update of every agent on its own samples (all its rounds): each on its own
    GPUs (the slowest counts) or in turn (the sum); memory: the largest agent's."""
    combine = np.maximum if sc.placement == "own" else np.add
    out: dict[str, Any] = {}
    for w in plan.train:
        tr = S.train_phases(sc, k, w)
        for name in ("t_old", "t_ref", "t_update"):
            out[name] = tr[name] if name not in out else combine(out[name], tr[name])
        for name in ("mem_old", "mem_ref", "mem_update"):
            out[name] = tr[name] if name not in out else np.maximum(out[name], tr[name])
        out["mfu"] = tr["mfu"] if "mfu" not in out else np.minimum(out["mfu"], tr["mfu"])
    if sc.placement == "shared":
        for name in ("mem_old", "mem_ref", "mem_update"):
            out[name] = np.where(np.asarray(out[name]) > 0, out[name] + (sc.num_agents - 1) * S.CUDA_CONTEXT_GB, 0.0)
    out["t_train"] = out["t_old"] + out["t_ref"] + out["t_update"]
    out["mem_train"] = np.maximum.reduce([np.asarray(out[m], dtype=float) for m in ("mem_old", "mem_ref", "mem_update")])
    return out


def system_step(sc: MultiAgentScenario, k: dict, plan: StepPlan, tasks: Any) -> dict[str, Any]:
    """Noise-free phase times and memories of one multi-agent step (``gen_side`` + ``train_side``)."""
    combine = np.maximum if sc.placement == "own" else np.add
    out = {**gen_side(sc, k, plan, tasks), **train_side(sc, k, plan)}
    parts: dict[str, Any] = {}
    for w in plan.train:
        ov = S.step_overheads(sc, k, w)
        for name in ("t_weights", "t_reward", "t_adv"):
            parts[name] = ov[name] if name not in parts else combine(parts[name], ov[name])
    out.update(parts)
    out["t_weights"] = out["t_weights"] + switch_seconds(sc, k)
    out["t_step"] = out["t_gen"] + out["t_train"] + out["t_weights"] + out["t_reward"] + out["t_adv"]
    out["peak_gb"] = np.maximum(np.asarray(out["mem_gen"], dtype=float), out["mem_train"])
    out["throughput"] = plan.tokens / (out["t_step"] * sc.total_gpus)
    return out


# ------------------------------------------------------------------------------------------ learning
#: the paper's ablation (Qwen2.5-3B debate): without shaping 45.6 -> 36.6 (MoA 43.1 -> 38.1)
PAPER_SHAPED, PAPER_UNSHAPED = 0.456, 0.366
SHAPING_ALPHA_OPT = {"margin": 0.5, "quality": 0.5}
SHAPING_PEAK = {"margin": 1.0, "quality": 1.0}
SCOPE_EFFICIENCY = {"step": 0.9, "window": 1.0, "all": 0.95}
ROUND_GAIN = {1: 0.0, 2: 1.0, 3: 1.15, 4: 1.25}  # debate gains saturate after a few rounds (Du et al. 2023)


def unshaped_efficiency(sc: MultiAgentScenario) -> float:
    """Share of the trainable gain (agents' and the workflow's) realised without shaping, such that the
    fully trained team lands at the paper's ratio: (36.6 - untrained) / (45.6 - untrained)."""
    untrained = sc.learning.score0 + sc.debate_gain0
    return (PAPER_UNSHAPED - untrained) / (PAPER_SHAPED - untrained)


def shaping_efficiency(sc: MultiAgentScenario, config: dict[str, Any]) -> float:
    """Credit-assignment efficiency in (E_none, 1]: 1 at the best shaping; ``unshaped_efficiency`` without.

    alpha acts as x*exp(1-x), x = alpha/alpha_opt (too little shaping leaves agents free-riding, too much
    lets the noisy margin dominate the verifier's reward); the history scope scales the shaped part.
    """
    e0 = unshaped_efficiency(sc)
    mode = str(config.get(SHAPING_MODE_KEY, "none"))
    alpha = float(config.get(SHAPING_ALPHA_KEY, 0.5) or 0.0)
    if mode == "none" or alpha <= 0:
        return e0
    x = alpha / SHAPING_ALPHA_OPT[mode]
    g = x * math.exp(1 - x) * SHAPING_PEAK[mode] * SCOPE_EFFICIENCY.get(str(config.get(HISTORY_SCOPE_KEY, "all")), 0.9)
    return e0 + (1 - e0) * max(0.0, min(1.0, g))


def team_score(sc: MultiAgentScenario, config: dict[str, Any], scores: Any, truncated: Any) -> Any:
    """The team's validation score from the agents' own scores (``scores``: [agent, ...] arrays).

    Each agent's gain over the base model counts at the shaping efficiency (losses in full); the team is
    the agents' mean (debate, by vote) or weighted toward the last agent (chain), plus the workflow's gain
    (``debate_gain0`` untrained, up to ``+ debate_gain_trained`` trained with shaping), scaled by the
    rounds and lost as far as the last prompt is truncated.
    """
    s0, head = sc.learning.score0, max(sc.learning.headroom, 1e-9)
    e = shaping_efficiency(sc, config)
    scores = np.asarray(scores, dtype=float)
    g = scores - s0
    eff = s0 + e * np.maximum(g, 0) + np.minimum(g, 0)
    n = sc.num_agents
    if sc.workflow == "chain":
        w = np.arange(1, n + 1, dtype=float)
        w = (w / w.sum()).reshape((n,) + (1,) * (eff.ndim - 1))
        base = (eff * w).sum(0)
        rounds_gain = 1.0
    else:
        base = eff.mean(0)
        rounds_gain = ROUND_GAIN[int(config.get(ROUNDS_KEY, sc.num_rounds) or 1)]
    trained = np.clip(e * np.maximum(g, 0).mean(0) / head, 0, 1.5)
    keep = 1 - np.asarray(truncated, dtype=float)
    bonus = rounds_gain * (sc.debate_gain0 + sc.debate_gain_trained * trained) * keep - 0.1 * (1 - keep)
    return np.clip(base + bonus, 0, 1)


def agent_trajectories(sc: MultiAgentScenario, config: dict[str, Any], steps: int, draws: list[float],
                       starts: list[dict[str, Any] | None] | None = None) -> list[L.LearningTrajectory]:
    """Every agent's learning dynamics under its own knobs (``learning.learning_trajectory``)."""
    return [L.learning_trajectory(agent_config(config, i), sc, steps, draws[i], start=(starts or [None] * sc.num_agents)[i])
            for i in range(sc.num_agents)]


def agent_finals(sc: MultiAgentScenario, agent_cfg: dict[str, Any], steps: int, n_draws: int = 16
                 ) -> list[tuple[float, float, float]]:
    """(final score, final truncated mean length, probability) of one agent over ``n_draws`` equally likely
    quantiles of its Exp(1) collapse threshold (distinct outcomes merged)."""
    free = L.learning_trajectory(agent_cfg, sc, steps, collapse_draw=math.inf)
    cum = np.cumsum(free.hazard)
    lk = L.LearningKnobs.from_config(agent_cfg, sc)
    out: dict[int | None, list[float]] = {}
    for q in range(n_draws):
        draw = -math.log(1 - (q + 0.5) / n_draws)
        hit = np.flatnonzero(cum >= draw)
        step = int(hit[0]) + 1 if hit.size else None
        if step not in out:
            tr = free if step is None else L.learning_trajectory(agent_cfg, sc, steps, float(cum[step - 1]))
            out[step] = [tr.score[-1], agent_lengths(sc, lk, tr.resp_mean_untruncated[-1]).mean, 0.0]
        out[step][2] += 1 / n_draws
    return [tuple(v) for v in out.values()]  # type: ignore[misc]


def truncation(sc: MultiAgentScenario, config: dict[str, Any], shown_len: Any) -> Any:
    """Share of the last stage's prompt beyond ``data.max_prompt_length`` (``shown_len``: the mean
    truncated answer length shown)."""
    rounds = int(config.get(ROUNDS_KEY, sc.num_rounds) or 1) if sc.workflow == "debate" else 1
    stages = stages_of(sc, rounds)
    last = sc.prompt_len_mean + (stages - 1) * sc.shown_answers * (np.asarray(shown_len, dtype=float) + sc.template_tokens)
    return np.maximum(0.0, 1 - sc.max_prompt_length / last)


def team_expectation(sc: MultiAgentScenario, config: dict[str, Any], finals: list[list[tuple[float, float, float]]]) -> float:
    """Expected team score over every combination of the agents' independent outcomes."""
    grids = np.meshgrid(*[np.arange(len(f)) for f in finals], indexing="ij")
    idx = [g.ravel() for g in grids]
    scores = np.stack([np.array([f[0] for f in finals[i]])[idx[i]] for i in range(len(finals))])
    lens = np.stack([np.array([f[1] for f in finals[i]])[idx[i]] for i in range(len(finals))])
    prob = np.prod(np.stack([np.array([f[2] for f in finals[i]])[idx[i]] for i in range(len(finals))]), axis=0)
    team = team_score(sc, config, scores, truncation(sc, config, lens.mean(0)))
    return float((team * prob).sum())


def expected_team_score(config: dict[str, Any], sc: MultiAgentScenario, steps: int, n_draws: int = 16) -> float:
    """Expected team validation score after ``steps`` steps, without measurement noise: each agent's
    collapse threshold is an independent Exp(1) draw, averaged over ``n_draws`` equally likely quantiles
    of each (every combination across agents)."""
    finals = [agent_finals(sc, agent_config(config, i), steps, n_draws) for i in range(sc.num_agents)]
    return team_expectation(sc, config, finals)


def workflow_metrics(sc: MultiAgentScenario, config: dict[str, Any], ent_ratio: list[float], scores: list[float],
                     rewards: list[float]) -> dict[str, float]:
    """Workflow health signals (heuristics, no public figures; docs/sim.md): how often round 2 changes an
    answer, how often the agents end agreeing, each agent's copying of another's answer, and each agent's
    share of the (shaped) reward."""
    n = sc.num_agents
    r = np.clip(np.asarray(ent_ratio, dtype=float), 0, 3)
    rounds = int(config.get(ROUNDS_KEY, sc.num_rounds) or 1) if sc.workflow == "debate" else n
    settled = 1 - np.minimum(r, 1.0)  # an agent whose entropy ran out stops revising and follows
    out: dict[str, float] = {}
    out["workflow/answer_change_rate"] = 0.0 if rounds <= 1 else float(0.3 * np.mean(np.minimum(r, 1.5)) ** 0.7)
    sc_ = np.clip(np.asarray(scores, dtype=float), 0, 1)
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    # both right, or the same wrong answer (about a third of shared misses), plus agents that stopped revising
    agree = np.mean([sc_[a] * sc_[b] + 0.3 * (1 - sc_[a]) * (1 - sc_[b]) + 0.35 * min(settled[a], settled[b])
                     for a, b in pairs])
    out["workflow/agreement"] = float(np.clip(agree, 0, 1))
    mode = str(config.get(SHAPING_MODE_KEY, "none"))
    alpha = 0.0 if mode == "none" else float(config.get(SHAPING_ALPHA_KEY, 0.5) or 0.0)
    rew = np.maximum(np.asarray(rewards, dtype=float), 1e-3)
    mean_r = rew.mean()
    shaped = np.maximum(mean_r + alpha * (rew - mean_r), 1e-6)  # no shaping: every agent gets the team reward
    for i in range(n):
        out[f"agent{i}/copy_rate"] = 0.0 if rounds <= 1 else float(0.08 + 0.45 * settled[i])
        out[f"agent{i}/reward_share"] = float(shaped[i] / shaped.sum())
    return out


# ------------------------------------------------------------------------------------------ one trial
def simulate(config: dict[str, Any], sc: MultiAgentScenario, steps: int, seed: int = 0,
             start: dict[str, Any] | None = None, save_steps: tuple[int, ...] | list[int] = ()):
    """One multi-agent trial as a timed metric stream (the ``model.simulate`` contract; ``sc`` already
    carries the memory capacity)."""
    n_gpus = sc.total_gpus
    errors = search_space(sc).check_constraints(config)
    if errors:
        return SimResult([], "failed", "config rejected: " + " ".join(errors), 8.0, 0, n_gpus, 0.0, steps)
    n = sc.num_agents
    k = S.knobs_from_config(config)
    tasks = float(config.get(ASYNC_KEY, 0) or 0)
    first = 1 if start is None else int(start["step"]) + 1
    branch = () if start is None else ("branch", first)
    rngs = [np.random.default_rng(seed_hash("learn", seed, i, seed_hash(learning_part(agent_config(config, i))), sc.name, *branch))
            for i in range(n)]
    rng_team = np.random.default_rng(seed_hash("team", seed, {k2: v for k2, v in config.items()
                                                            if k2.startswith(("workflow.", "reward."))}, sc.name, *branch))
    rng_sys = np.random.default_rng(seed_hash("sys", seed, config, sc.name, *branch))
    draws = [float(g.exponential(1.0)) for g in rngs]
    starts = None
    if start is not None:
        starts = start["agents"]
        draws = [float(s["collapse_draw"]) for s in starts]
    trajs = agent_trajectories(sc, config, steps, draws, starts)
    val_sigma = 0.05 * sc.learning.headroom + 0.0015
    lks = [L.LearningKnobs.from_config(agent_config(config, i), sc) for i in range(n)]
    info: dict[str, Any] = {"agents": [{"collapse_step": t.collapse_step, "collapse_kind": t.collapse_kind, "x": t.x}
                                       for t in trajs]}
    info["collapse_step"] = min((t.collapse_step for t in trajs if t.collapse_step), default=None)
    info["collapse_kind"] = next((t.collapse_kind for t in trajs if t.collapse_kind), None)

    t = init_seconds(sc, k) + 10.0 * (n - 1)  # every agent's workers start (in parallel, plus coordination)
    init_s = t
    capacity = sc.gpu.memory_gb
    test_freq = int(config.get("trainer.test_freq", sc.test_freq) or -1)

    def lens_at(i_step: int | None) -> list[float]:
        return [tr.resp_mean_untruncated[i_step] if i_step is not None and tr.resp_mean_untruncated else sc.learning.resp_len0
                for tr in trajs]

    def val_metrics(scores: list[float], lens: list[float]) -> dict[str, float]:
        plan = step_plan(sc, config, lens)
        team = float(team_score(sc, config, np.array(scores), plan.truncated))
        noisy = float(np.clip(team + rng_team.normal(0, val_sigma), 0, 1))
        out = {VAL_KEY: noisy}
        for name, mult in sc.val_benchmarks:
            out[f"val-aux/{name}/reward/mean@1"] = float(np.clip(noisy * mult + rng_team.normal(0, 2 * val_sigma), 0, 1))
        for i, s in enumerate(scores):
            out[f"agent{i}/val/score"] = float(np.clip(s + rngs[i].normal(0, val_sigma), 0, 1))
        return out

    def val_seconds(lens: list[float]) -> float:
        plan = step_plan(sc, config, lens)
        total = 0.0
        for ws in plan.gen:  # one response per validation prompt, every stage
            total += max(scalar(S.rollout_phase(sc, k, replace(w, n=1), seqs=sc.val_size)["t_gen"]) for w in ws)
        return total + 0.3 + sc.val_size * 0.4e-3 * plan.stages

    plan1 = step_plan(sc, config, lens_at(0))
    o1 = system_step(sc, k, plan1, tasks)
    if bool(np.asarray(o1["kv_fail"])):
        reason = (f"vLLM: no memory left for the KV cache (budget {k['util'] * capacity:.1f} GiB, "
                  f"KV pool {scalar(o1['kv_pool_gb']):.1f} GiB): raise gpu_memory_utilization or TP")
        return SimResult([], "oom", reason, t * 0.8, 0, n_gpus, init_s, steps, info)

    events = []
    score0 = [tr.score0 for tr in trajs]
    if config.get("trainer.val_before_train", True):
        tv = val_seconds(lens_at(None))
        t += tv
        events.append(SimEvent(t, first - 1, {**val_metrics(score0, lens_at(None)), "timing_s/testing": tv}))
    checkpoints = {}
    for st in save_steps:
        if first <= int(st) <= steps:
            states = [tr.state_at(int(st)) for tr in trajs]
            checkpoints[int(st)] = {"step": int(st), "progress": float(np.mean([s["progress"] for s in states])),
                                    "agents": states}
    ent1 = [tr.entropy[0] if tr.entropy else sc.learning.entropy0 for tr in trajs]
    for step in range(first, steps + 1):
        i = step - first
        lens = [tr.resp_mean_untruncated[i] * float(np.exp(rngs[a].normal(0, LENGTH_NOISE))) for a, tr in enumerate(trajs)]
        plan = step_plan(sc, config, lens)
        o = system_step(sc, k, plan, tasks)
        slow = WARMUP_SLOWDOWN.get(step, 1.0)
        phases = {}
        for name, key in (("gen", "t_gen"), ("old_log_prob", "t_old"), ("ref", "t_ref"), ("update_actor", "t_update"),
                          ("update_weights", "t_weights"), ("reward", "t_reward"), ("adv", "t_adv")):
            phases[name] = scalar(o[key]) * slow * float(np.exp(rng_sys.normal(0, TIMING_NOISE * sc.noise_scale)))
        mems = {"gen": scalar(o["mem_gen"]), "old_log_prob": scalar(o["mem_old"]), "ref": scalar(o["mem_ref"]),
                "update_actor": scalar(o["mem_update"])}
        mems = {p: m + float(rng_sys.normal(0, MEMORY_NOISE_GB)) if m > 0 else 0.0 for p, m in mems.items()}
        elapsed = 0.0
        for phase in ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"):
            if mems.get(phase, 0.0) > capacity:
                reason = (f"CUDA out of memory in {phase} at step {step}: needs {mems[phase]:.1f} GiB of "
                          f"{capacity:.0f} GiB (longest prompt {max(plan.prompt_means):.0f} tokens)")
                return SimResult(events, "oom", reason, t + elapsed + 0.5 * phases[phase], step - 1, n_gpus, init_s,
                                   steps, info, {c: v for c, v in checkpoints.items() if c < step})
            elapsed += phases[phase]
        if not any(lk.use_kl for lk in lks):
            phases.pop("ref")
        step_s = sum(phases.values())
        peak = max(mems.values())
        data: dict[str, float] = {f"timing_s/{p}": v for p, v in phases.items()}
        gen_tokens = sum(w.seqs * w.resp_mean for ws in plan.gen for w in ws)
        data.update({
            "timing_s/step": step_s,
            "timing_per_token_ms/gen": 1000 * phases["gen"] / gen_tokens,
            "timing_per_token_ms/update_actor": 1000 * phases["update_actor"] / plan.tokens,
            "perf/total_num_tokens": plan.tokens,
            "perf/time_per_step": step_s,
            "perf/throughput": plan.tokens / (step_s * n_gpus),
            "perf/mfu/actor": scalar(o["mfu"]),
            "perf/max_memory_allocated_gb": peak,
            "perf/max_memory_reserved_gb": peak + 0.8,
            "sim/memory/gen_gb": mems["gen"],
            "sim/memory/old_log_prob_gb": mems["old_log_prob"],
            "sim/memory/update_actor_gb": mems["update_actor"],
            "sim/rollout/concurrency": scalar(o["concurrency"]),
            "sim/rollout/kv_cache_gb": scalar(o["kv_pool_gb"]),
            "sim/workflow/last_prompt_mean": plan.prompt_means[-1],
            "training/global_step": float(step),
            "training/epoch": 0.0,
            "prompt_length/mean": float(np.mean([min(p, sc.max_prompt_length) for p in plan.prompt_means])),
            "prompt_length/clip_ratio": plan.truncated,
            "global_seqlen/mean": plan.tokens / n_gpus,
        })
        scores = [tr.score[i] for tr in trajs]
        rewards = []
        for a, tr in enumerate(trajs):
            noise = lambda sigma, g=rngs[a]: float(np.exp(g.normal(0, sigma)))  # noqa: E731
            reward = float(np.clip(tr.reward[i] + rngs[a].normal(0, 0.01), 0, 1))
            rewards.append(reward)
            w = plan.train[a]
            pre = f"agent{a}/"
            data.update({
                pre + "actor/entropy": tr.entropy[i] * noise(0.03),
                pre + "actor/ppo_kl": tr.ppo_kl[i] * noise(0.2),
                pre + "actor/pg_clipfrac": tr.pg_clipfrac[i] * noise(0.15),
                pre + "actor/grad_norm": tr.grad_norm[i] * noise(0.15),
                pre + "actor/lr": tr.lr[i],
                pre + "critic/score/mean": reward,
                pre + "response_length/mean": w.resp_mean,
                pre + "response_length/max": w.resp_max,
                pre + "response_length/clip_ratio": agent_lengths(sc, lks[a], lens[a]).clip,
            })
            if lks[a].use_kl:
                data[pre + "actor/kl_loss"] = tr.kl_loss[i] * noise(0.1)
        team_now = float(team_score(sc, config, np.array(scores), plan.truncated))
        team_reward = float(np.clip(np.mean(rewards) + (team_now - np.mean(scores)), 0, 1))
        data.update({"critic/score/mean": team_reward, "critic/rewards/mean": team_reward, "critic/score/max": 1.0,
                     "critic/score/min": 0.0,
                     "response_length/mean": float(np.mean([w.resp_mean for w in plan.train])),
                     "response_length/max": float(max(w.resp_max for w in plan.train))})
        data.update(workflow_metrics(sc, config, [tr.entropy[i] / ent1[a] for a, tr in enumerate(trajs)], scores, rewards))
        t += step_s
        if test_freq > 0 and (step % test_freq == 0 or step == steps):
            clean = [tr.resp_mean_untruncated[i] for tr in trajs]
            tv = val_seconds(clean)
            t += tv
            data.update(val_metrics(scores, clean))
            data["timing_s/testing"] = tv
        events.append(SimEvent(t, step, data))
    return SimResult(events, "completed", None, t, steps, n_gpus, init_s, steps, info, checkpoints)


# ------------------------------------------------------------------------------------------ noise-free
def window_plans(sc: MultiAgentScenario, config: dict[str, Any], horizon: int) -> list[StepPlan]:
    """Noise-free step plans of the throughput window's steps (updates 3-5)."""
    from mart.state.objectives import throughput_window

    first, last = throughput_window(horizon)
    trajs = agent_trajectories(sc, config, last, [math.inf] * sc.num_agents)
    return [step_plan(sc, config, [tr.resp_mean_untruncated[s - 1] for tr in trajs]) for s in range(first, last + 1)]


def expected_throughput(config: dict[str, Any], sc: MultiAgentScenario, horizon: int = 6) -> tuple[float, float]:
    k = S.knobs_from_config(config)
    tasks = float(config.get(ASYNC_KEY, 0) or 0)
    thr, peak = [], 0.0
    for plan in window_plans(sc, config, horizon):
        o = system_step(sc, k, plan, tasks)
        thr.append(float(np.asarray(o["throughput"])))
        peak = max(peak, float(np.asarray(o["peak_gb"])))
    return float(np.mean(thr)), peak


ASYNC_GRID = [0, 16, 64, 128, 256, 512, 1024, 2048]


@functools.lru_cache(maxsize=16)
def ground_truth(sc: MultiAgentScenario, margin: float, horizon: int, top_k: int = 64) -> dict[str, Any]:
    """The best stage-1 config over the single-agent system grids (``model.ROLLOUT_GRID``, ``TRAIN_*``,
    ``SHARED``) times ``ASYNC_GRID``, noise-free, by exhaustive evaluation (the same pairing of the
    rollout and training sides as ``model.ground_truth``; every agent shares the system knobs)."""
    cfg0 = base_config(sc)
    space = search_space(sc)
    limit = (1 - margin) * sc.gpu.memory_gb
    k0 = S.knobs_from_config(cfg0)
    plans = window_plans(sc, cfg0, horizon)
    tokens = np.array([p.tokens for p in plans])
    rgrid = grid_columns(ROLLOUT_GRID)
    r_valid = valid_mask(space, rgrid, ["mnbt", "chunked", "tp"], cfg0)
    tgrid = train_grid(k0, cfg0)
    t_valid = valid_mask(space, tgrid, ["dyn", "ppo_micro", "lp_micro", "tok_cap", "sp", "remove_pad"], cfg0)
    best: dict[str, Any] = {"throughput": -1.0}
    evaluated = 0
    for combo in itertools.product(*SHARED.values()):
        shared = dict(zip(SHARED, combo))
        kt = {**k0, **tgrid, **shared, "free_cache": 1.0}
        t_time = np.zeros((len(plans), len(tgrid["dyn"])))
        t_mem = np.zeros(len(tgrid["dyn"]))
        for i, plan in enumerate(plans):
            o = train_side(sc, kt, plan)
            t_time[i], t_mem = o["t_train"], np.maximum(t_mem, o["mem_train"])
        t_ok = t_valid & (t_mem <= limit)
        if not t_ok.any():
            continue
        t_idx = np.flatnonzero(t_ok)
        t_idx = t_idx[np.argsort(t_time[:, t_idx].sum(0))[: top_k * (1 if shared["free_cache"] else 8)]]
        kept = (1 - shared["free_cache"]) * rgrid["util"] * sc.gpu.memory_gb
        for tasks in ASYNC_GRID:
            kr = {**k0, **rgrid, **shared}
            r_ok = r_valid & _valid_async(space, rgrid, cfg0, tasks)
            g_time = np.zeros((len(plans), len(rgrid["util"])))
            r_mem = np.zeros(len(rgrid["util"]))
            for i, plan in enumerate(plans):
                o = gen_side(sc, kr, plan, tasks)
                g_time[i] = o["t_gen"] + o["t_over"]
                r_mem = np.maximum(r_mem, o["mem_gen"])
                r_ok &= ~np.asarray(o["kv_fail"])
            evaluated += r_mem.size
            r_ok &= r_mem <= limit
            if not r_ok.any():
                continue
            r_idx = np.flatnonzero(r_ok)
            r_idx = r_idx[np.argsort(g_time[:, r_idx].sum(0))[:top_k]]
            step = g_time[:, r_idx][:, :, None] + t_time[:, t_idx][:, None, :]
            thr = (tokens[:, None, None] / (step * sc.total_gpus)).mean(0)
            pair_ok = (t_mem[t_idx][None, :] + kept[r_idx][:, None]) <= limit
            thr = np.where(pair_ok, thr, -1.0)
            i, j = np.unravel_index(int(np.argmax(thr)), thr.shape)
            if thr[i, j] > best["throughput"]:
                ri, ti = r_idx[i], t_idx[j]
                knobs = {**{nm: float(rgrid[nm][ri]) for nm in rgrid}, **{nm: float(tgrid[nm][ti]) for nm in tgrid}, **shared}
                best = {"throughput": float(thr[i, j]), "knobs": knobs, "tasks": tasks,
                        "peak_memory_gb": max(float(r_mem[ri]), float(t_mem[ti] + kept[ri]))}
        evaluated += t_mem.size
    base_thr, base_peak = expected_throughput(cfg0, sc, horizon)
    full = {**cfg0, **knobs_to_overrides(best.get("knobs", {}))}
    if "tasks" in best:
        full[ASYNC_KEY] = int(best["tasks"])
    overrides = {k: v for k, v in full.items() if cfg0.get(k) != v}
    if not full.get(A + "use_dynamic_bsz"):
        overrides.pop(A + "ppo_max_token_len_per_gpu", None)
    else:
        for key in (A + "ppo_micro_batch_size_per_gpu", R + "log_prob_micro_batch_size_per_gpu",
                    f"{ARR}.ref.log_prob_micro_batch_size_per_gpu"):
            overrides.pop(key, None)
    if not any(full.get(agent_key(i, A + "use_kl_loss")) for i in range(sc.num_agents)):
        overrides.pop(f"{ARR}.ref.log_prob_micro_batch_size_per_gpu", None)
    return {"scenario": sc.name, "config": {**cfg0, **overrides}, "throughput": best["throughput"], "overrides": overrides,
            "peak_memory_gb": best.get("peak_memory_gb"), "baseline_throughput": base_thr,
            "baseline_peak_memory_gb": base_peak, "gain_pct": 100 * (best["throughput"] / base_thr - 1),
            "limit_gb": limit, "evaluated": evaluated}


def _valid_async(space: SearchSpace, rgrid: dict[str, np.ndarray], cfg0: dict[str, Any], tasks: int) -> np.ndarray:
    return valid_mask(space, {**rgrid, "tasks": np.full_like(rgrid["tp"], tasks)}, ["tp"], {**cfg0, ASYNC_KEY: tasks})


#: the symmetric per-agent grid of the learning ground truth (every agent the same knobs: same model, same role)
AGENT_GRID: dict[str, list[Any]] = {
    A + "optim.lr": [1e-6, 2e-6, 3e-6, 5e-6, 7e-6, 1e-5, 2e-5],
    A + "use_kl_loss": [False, True],
    A + "clip_ratio_high": [0.2, 0.28],
    R + "temperature": [0.8, 1.0, 1.2],
}
GLOBAL_GRID: dict[str, list[Any]] = {
    SHAPING_MODE_KEY: list(SHAPING_MODES),
    SHAPING_ALPHA_KEY: [0.1, 0.25, 0.5, 1.0],
    HISTORY_SCOPE_KEY: list(HISTORY_SCOPES),
}


@functools.lru_cache(maxsize=16)
def ground_truth_learning(sc: MultiAgentScenario, horizon: int = 30) -> dict[str, Any]:
    """Best expected team score over the symmetric per-agent grid (``AGENT_GRID``: every agent the same
    knobs, as the agents share the model and the role) x rounds 1-4 x shaping (``GLOBAL_GRID``), exhaustive.

    An agent's outcomes do not depend on the rounds or the shaping (they act on the team score only), so
    each per-agent config's outcomes are computed once and every rounds x shaping combination re-scored.
    """
    cfg0 = base_config(sc)
    base = expected_team_score(cfg0, sc, horizon)
    rounds_list: list[dict[str, Any]] = ([{ROUNDS_KEY: r} for r in range(1, 5)] if sc.workflow == "debate" else [{}])
    shapings = [dict(zip(GLOBAL_GRID, v)) for v in itertools.product(*GLOBAL_GRID.values())
                if v[0] != "none" or (v[1] == 0.5 and v[2] == "all")]
    best_score, best_over = -1.0, {}
    evaluated = 0
    for values in itertools.product(*AGENT_GRID.values()):
        per = dict(zip(AGENT_GRID, values))
        over = {agent_key(i, k): v for i in range(sc.num_agents) for k, v in per.items()}
        cfg = {**cfg0, **over}
        finals = agent_finals(sc, agent_config(cfg, 0), horizon)
        for extra in rounds_list:
            for sh in shapings:
                s = team_expectation(sc, {**cfg, **extra, **sh}, [finals] * sc.num_agents)
                evaluated += 1
                if s > best_score:
                    best_score, best_over = s, {**over, **extra, **sh}
    return {"scenario": sc.name, "score": best_score, "overrides": {k: v for k, v in best_over.items() if cfg0.get(k) != v},
            "baseline_score": base, "gain": best_score - base, "evaluated": evaluated}


__all__ = ["ASYNC_KEY", "HISTORY_SCOPE_KEY", "MA_FOCUS", "MultiAgentScenario", "PER_AGENT_KEYS", "ROUNDS_KEY", "SHAPING_ALPHA_KEY",
           "SHAPING_MODE_KEY", "agent_config", "agent_key", "async_factor", "expected_team_score", "focus_space",
           "ground_truth", "ground_truth_learning", "is_multi_agent", "search_space", "shaping_efficiency", "simulate",
           "system_step", "team_score"]
