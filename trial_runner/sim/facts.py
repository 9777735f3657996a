"""Public facts the simulator must reproduce, measured on the simulator (direction and rough size).

Each ``Fact`` names its public source (docs/sim.md, "Public facts", gives the full citations), the public
figure, the simulator's figure and the band the simulator must fall in. ``measure_facts()`` computes them
all (a few seconds); ``python -m mart.trial_runner.sim.facts`` prints the table. The tests in
``tests/trial_runner/test_sim_facts.py`` assert each band.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from mart.trial_runner.sim import learning as L
from mart.trial_runner.sim import model as M
from mart.trial_runner.sim import system as S
from mart.trial_runner.sim.scenarios import Scenario, load_scenario

A, R, REF, MD = S.A, S.R, S.REF, S.M


@dataclass(frozen=True)
class Fact:
    name: str
    public: str  # the public figure, as the source states it
    source: str
    value: float  # the simulator's figure
    low: float  # band the simulator's figure must lie in
    high: float
    unit: str = ""

    @property
    def ok(self) -> bool:
        return self.low <= self.value <= self.high


def step_phases(config: dict[str, Any], sc: Scenario, horizon: int = 6) -> dict[str, float]:
    """Noise-free phase times (s), peak memories (GiB) and throughput averaged over updates 3-5."""
    k = S.knobs_from_config(config)
    rows = [S.simulate_step(sc, k, w) for w in M.window_workloads(sc, config, horizon)]
    keys = ("t_gen", "t_old", "t_ref", "t_update", "t_weights", "t_reward", "t_adv", "t_step", "throughput",
            "mem_gen", "mem_old", "mem_ref", "mem_update", "peak_gb", "mfu")
    return {key: sum(float(r[key]) for r in rows) / len(rows) for key in keys}


def _rel(config: dict[str, Any], sc: Scenario, change: dict[str, Any], key: str) -> float:
    """Relative change of phase ``key`` when ``change`` is applied to ``config``."""
    before = step_phases(config, sc)[key]
    after = step_phases({**config, **change}, sc)[key]
    return after / before - 1


def entropy_curve(config: dict[str, Any], sc: Scenario, steps: int) -> list[float]:
    return L.learning_trajectory(config, sc, steps, collapse_draw=math.inf).entropy


def measure_facts(perturb: int | None = None) -> list[Fact]:
    """Every public fact, measured on the shipped and calibration scenarios."""
    small = load_scenario("qwen3-0.6b-1x8", perturb)
    big = load_scenario("qwen3-8b-1x8", perturb)
    q7 = load_scenario("qwen2-7b-gsm8k-h20", perturb)
    cfg_s, cfg_b, cfg_q7 = M.base_config(small), M.base_config(big), M.base_config(q7)
    facts: list[Fact] = []
    add = facts.append

    # KV-bound (verl's yaml max_num_seqs 1024): at the catalogue's 256 sequences the 0.6B's pool is not the
    # limit, and vLLM gains nothing from a larger one - docs/sim.md, "Public facts"
    kv_bound = {**cfg_s, R + "max_num_seqs": 1024}
    add(Fact("memory share alone helps a KV-bound small model (0.6B, 1024 seqs, util 0.5 -> 0.8, throughput)",
             "+11% E2E at 0.80 -> 0.88", "NeMo-RL (235B, KV-bound); verl perf guide",
             _rel(kv_bound, small, {R + "gpu_memory_utilization": 0.8}, "throughput"), 0.03, 0.6, "rel"))
    off_p = step_phases({**cfg_b, A + "fsdp_config.param_offload": True}, big)["t_step"]
    off_o = step_phases({**cfg_b, A + "fsdp_config.optimizer_offload": True}, big)["t_step"]
    base_b = step_phases(cfg_b, big)["t_step"]
    add(Fact("param offload slows the step (8B)", "large ('big perf impact', Megatron)", "verl C550 Qwen3-8B doc",
             off_p / base_b - 1, 0.015, 1.0, "rel"))
    add(Fact("param offload costs more than optimizer offload (8B, s/s)", "param: large; optimizer: small",
             "verl C550 Qwen3-8B doc", (off_p - base_b) / max(off_o - base_b, 1e-9), 1.1, 10.0, "ratio"))
    # verl PR #7804 measured a small model on 2 GPUs: the same job shape here (0.6B, 1x2, 256 prompts x 8)
    two = replace(small, name="qwen3-0.6b-1x2", gpus_per_node=2, train_batch_size=256)
    cfg_two = {**M.base_config(two), A + "ppo_mini_batch_size": 64}
    add(Fact("optimizer offload slows the actor update (0.6B on 2 GPUs)", "+9.6% actor time",
             "verl PR #7804 (FSDP2, small model, 2 GPUs)",
             _rel(cfg_two, two, {A + "fsdp_config.optimizer_offload": True}, "t_update"), 0.05, 0.3, "rel"))
    add(Fact("param offload slows the step (0.6B on 2 GPUs)", "large ('big perf impact', Megatron)",
             "verl C550 Qwen3-8B doc", _rel(cfg_two, two, {A + "fsdp_config.param_offload": True}, "t_step"),
             0.015, 1.0, "rel"))
    add(Fact("eager mode (no CUDA graphs) slows generation (7B)", "rollout 62 -> 85 s (+37%)", "verl vLLM 0.7 doc",
             _rel(cfg_q7, q7, {R + "enforce_eager": True}, "t_gen"), 0.2, 0.6, "rel"))
    add(Fact("CUDA graphs speed up a small model's generation (0.6B, tok/s)", "+85% tok/s (0.5B)", "verl issue #1133",
             1 / (1 + _rel(cfg_s, small, {R + "enforce_eager": True}, "t_gen")) ** -1 - 1, 0.45, 1.3, "rel"))
    p7 = step_phases(cfg_q7, q7)
    add(Fact("Qwen2-7B H20: gen (s)", "38.5-43", "verl-data gsm8k/qwen2-7b-fsdp2.log", p7["t_gen"], 30, 52, "s"))
    add(Fact("Qwen2-7B H20: old_log_prob (s)", "24-25", "verl-data gsm8k/qwen2-7b-fsdp2.log", p7["t_old"], 19, 31, "s"))
    add(Fact("Qwen2-7B H20: ref (s)", "24-25", "verl-data gsm8k/qwen2-7b-fsdp2.log", p7["t_ref"], 19, 31, "s"))
    add(Fact("Qwen2-7B H20: update_actor (s)", "72-77", "verl-data gsm8k/qwen2-7b-fsdp2.log", p7["t_update"], 58, 92, "s"))
    add(Fact("Qwen2-7B H20: step (s)", "160-172", "verl-data gsm8k/qwen2-7b-fsdp2.log", p7["t_step"], 135, 200, "s"))
    add(Fact("Qwen2-7B H20 without checkpointing fits 96 GB (peak GiB)", "ran on 96 GB cards",
             "verl-data gsm8k/qwen2-7b-fsdp2.log", p7["peak_gb"], 40, 96, "GiB"))

    h200, a100 = load_scenario("r1-distill-1.5b-8k-h200", perturb), load_scenario("r1-distill-1.5b-8k-a100", perturb)
    ratio = step_phases(M.base_config(h200), h200)["t_step"] / step_phases(M.base_config(a100), a100)["t_step"]
    add(Fact("long-tail rollout: R1-Distill-1.5B 8K step H200/A100", "0.91 (360 s vs 394 s)", "rllm-org/rllm #29",
             ratio, 0.75, 1.0, "ratio"))

    horizon = 240
    ent = entropy_curve(cfg_b, big, horizon)
    add(Fact("entropy falls fast early (first 1/12 of training)", "-73% in the first ~1/12", "Cui et al. 2025",
             ent[horizon // 12 - 1] / ent[0] - 1, -0.85, -0.55, "rel"))
    long = L.learning_trajectory({**cfg_b, A + "optim.lr": 3e-6}, big, 300, collapse_draw=math.inf)
    add(Fact("entropy exhaustion is bounded: lowest score over 300 steps (8B, lr 3e-6)", "scores stay >= 0",
             "bounded rewards (a score is a pass rate)", min(long.score), max(0.0, big.learning.score0 - big.learning.headroom),
             1.0, "score"))
    add(Fact("no clip-higher: entropy near 0 within hundreds of steps (8B, 300 steps, share left)",
             "entropy -> 0 within hundreds of steps", "DAPO (Yu et al. 2025)", long.entropy[-1] / long.entropy[0],
             0.0, 0.2, "share"))
    kl = {A + "use_kl_loss": True, A + "kl_loss_coef": 0.01}
    e_kl = entropy_curve({**cfg_b, **kl}, big, 60)[-1]
    e_no = entropy_curve(cfg_b, big, 60)[-1]
    add(Fact("a KL loss slows entropy decay (8B, coef 0.01, entropy at 60 vs without)", "KL > 0 holds entropy up",
             "sim-facts: KL holds entropy, final score below KL = 0", e_kl / e_no - 1, 0.1, 5.0, "rel"))
    ch = {A + "clip_ratio_high": 0.28}
    e_ch = L.learning_trajectory({**cfg_b, **ch, A + "optim.lr": 3e-6}, big, 300, collapse_draw=math.inf).entropy
    add(Fact("clip-higher 0.28 holds entropy (8B, 300 steps, share left)", "entropy stays 0.3-0.7 (of ~0.5-1 start)",
             "DAPO (Yu et al. 2025); verl best practices", e_ch[-1] / e_ch[0], 0.3, 1.5, "share"))
    bonus = {A + "entropy_coeff": 0.01}
    e_b = entropy_curve({**cfg_b, **bonus}, big, 60)
    add(Fact("entropy bonus 1e-2 explodes entropy, short of ln(vocab) (8B, 60 steps, nats)", "explodes (secondary)",
             "sim-facts: entropy_coeff 1e-2 explodes", max(e_b), e_b[0] * 1.5, 0.5 * math.log(big.model.vocab), "nats"))
    s_bonus = L.final_score_noise_free({**cfg_b, **bonus}, big, 30)
    s_small = L.final_score_noise_free({**cfg_b, A + "entropy_coeff": 0.001}, big, 30)
    add(Fact("entropy bonus 1e-2 scores below 1e-3 (8B, 30 steps)", "1e-2 explodes; 1e-4..1e-3 mild",
             "sim-facts: entropy_coeff", s_bonus - s_small, -1.0, -1e-3, "score"))
    facts.extend(schedule_facts(big, cfg_b))
    facts.extend(dynamics_facts(small, big))
    return facts


def step_at(config: dict[str, Any], sc: Scenario, step: int) -> dict[str, float]:
    """Noise-free phase times (s) and peak memory (GiB) of global step ``step`` of ``config`` run from the base
    model (its responses as long as the learning state has made them by then)."""
    lk = L.LearningKnobs.from_config(config, sc)
    traj = L.learning_trajectory(config, sc, step, collapse_draw=math.inf)
    w, _ = M._workload(sc, lk, traj.resp_mean_untruncated[-1], lk.use_kl)
    o = S.simulate_step(sc, S.knobs_from_config(config), w)
    return {key: float(o[key]) for key in ("t_gen", "t_step", "peak_gb")}


def dynamics_facts(base: Scenario, big: Scenario) -> list[Fact]:
    """The non-stationary dynamics of issue 24: what changes under a fixed config as training proceeds
    (``base``: a base model, e.g. Qwen3-0.6B-Base; ``big``: a reasoning model, e.g. Qwen3-8B)."""
    out: list[Fact] = []
    cfg = M.base_config(base)
    limit = base.max_response_length
    long = L.learning_trajectory(cfg, base, 300, collapse_draw=math.inf)
    out.append(Fact("a base model's responses lengthen several-fold under GRPO (0.6B-Base defaults, mean at step 300 "
                    "/ step 1)", "~1k -> 4k+ tokens (Qwen2.5-32B base)", "DAPO (arXiv 2503.14476)",
                    long.resp_mean_untruncated[-1] / long.resp_mean_untruncated[0], 2.0, 6.0, "ratio"))
    hot = {**cfg, A + "optim.lr": 3e-6}
    past = L.learning_trajectory(hot, base, 60, collapse_draw=math.inf)
    clip60 = L.clip_ratio(past.resp_mean_untruncated[-1], base.resp_cv, limit)
    out.append(Fact(f"the response limit binds as responses grow (0.6B-Base, lr 3e-6, clip ratio at step 60, limit "
                    f"{limit})", "reward dropped at 8K as responses were cut: DeepScaleR moved to 16K",
                    "DeepScaleR blog; rllm-org/rllm #33", clip60, 0.05, 0.4, "share"))
    stay = L.learning_trajectory(hot, base, 120, collapse_draw=math.inf, start=past.state_at(60))
    longer = L.learning_trajectory({**hot, "data.max_response_length": 2 * limit}, base, 120,
                                   collapse_draw=math.inf, start=past.state_at(60))
    out.append(Fact("raising the limit once it binds pays by the end (0.6B-Base, x2 at step 60, score at 120, share "
                    "of the headroom)", "8K -> 16K -> 24K stages: AIME24 43.1% (+14.3 over the base)",
                    "DeepScaleR blog; rllm-org/rllm #44", (longer.score[-1] - stay.score[-1]) / base.learning.headroom,
                    0.02, 0.5, "share"))
    t1 = step_at(hot, base, 60)["t_step"]
    t2 = step_at({**hot, "data.max_response_length": 2 * limit}, base, 60)["t_step"]
    out.append(Fact("a longer limit lengthens the step once responses reach it (0.6B-Base step 60, limit x2)",
                    "at >= 8K most of the step is sampling; train 8K first for efficiency",
                    "rllm-org/rllm #6; DeepScaleR blog", t2 / t1, 1.15, 2.5, "ratio"))
    ent = L.learning_trajectory(M.base_config(big), big, 60, collapse_draw=math.inf)
    sharp = ent.entropy[-1] / ent.entropy[0]
    out.append(Fact("the best training temperature rises as entropy falls (8B defaults, T* at step 60)",
                    "Qwen3-4B trained at 1.4 -> 1.45 -> 1.5 (+0.05 after a slight entropy drop)",
                    "POLARIS (hkunlp.github.io/blog/2025/Polaris)", L.temperature_optimum(sharp), 1.03, 1.3, "T"))
    q_late = L.temperature_quality(1.0, L.temperature_optimum(sharp)) / L.temperature_quality(1.1, L.temperature_optimum(sharp))
    q_early = L.temperature_quality(1.0) / L.temperature_quality(1.1)
    out.append(Fact("a fixed temperature is right early and too cold late (8B: quality at T 1.0 / at 1.1, step 60 "
                    "over step 1)", "temperature raised stage by stage", "POLARIS", q_late / q_early, 0.5, 0.97, "ratio"))
    lr3 = {**M.base_config(big), A + "optim.lr": 3e-6}
    h = L.learning_trajectory(lr3, big, 240, collapse_draw=math.inf).hazard
    out.append(Fact("the same lr grows riskier as training proceeds (8B, lr 3e-6: collapse hazard per step at 240 / "
                    "at 1)", "gradient noise and mismatch escalate as training progresses",
                    "arXiv 2602.01826", h[-1] / h[0], 1.1, 5.0, "ratio"))
    halved = L.learning_trajectory({**lr3, A + "optim.lr": 1.5e-6}, big, 241, collapse_draw=math.inf,
                                   start=L.learning_trajectory(lr3, big, 240, collapse_draw=math.inf).state_at(240))
    out.append(Fact("halving the lr late suppresses it (8B, at step 240: hazard after / before)",
                    "shrinking the update size suppresses the mismatch", "arXiv 2602.01826",
                    halved.hazard[0] / h[-1], 0.0, 0.1, "ratio"))
    return out


def schedule_facts(sc: Scenario, cfg: dict[str, Any], at: int = 60) -> list[Fact]:
    """What a schedule can change mid-run (branches from the step-``at`` checkpoint of verl's defaults)."""
    def cont(change: dict[str, Any], steps: int) -> L.LearningTrajectory:
        return L.learning_trajectory({**cfg, **change}, sc, steps, collapse_draw=math.inf, start=past.state_at(at))

    past = L.learning_trajectory(cfg, sc, at, collapse_draw=math.inf)
    out: list[Fact] = []
    clip = [L.clip_ratio(m, sc.resp_cv, sc.max_response_length) for m in past.resp_mean_untruncated]
    out.append(Fact(f"responses lengthen, the clip ratio rises (8B defaults, step 1 -> {at}, ratio)",
                    "4.2% -> 6.5% (DeepScaleR 8K stage)", "rllm-org/rllm #33", clip[-1] / clip[0], 1.2, 5.0, "ratio"))
    longer = cont({"data.max_response_length": 2 * sc.max_response_length}, at + 1)
    clip2 = L.clip_ratio(longer.resp_mean_untruncated[0], sc.resp_cv, 2 * sc.max_response_length)
    out.append(Fact(f"doubling the response limit at step {at} cuts the clip ratio (after / before)",
                    "8K -> 16K -> 24/32K stages", "rllm-org/rllm #44; Skywork-OR1", clip2 / clip[-1], 0.0, 0.5, "ratio"))
    t0 = float(cfg.get(R + "temperature", 1.0) or 1.0)
    hot = cont({R + "temperature": 1.2 * t0}, at + 1)
    out.append(Fact(f"temperature x1.2 at step {at} (1.0 -> 1.2) restores sampling entropy (after / before)",
                    "raise T as diversity falls", "POLARIS", hot.entropy[0] / past.entropy[-1], 1.1, 1.5, "ratio"))
    bonus = cont({A + "entropy_coeff": 0.005}, at + 30)
    out.append(Fact(f"an entropy bonus 5e-3 from step {at} raises entropy (30 steps later / before)",
                    "bonus switched on below the entropy target", "Skywork-OR1 (adaptive entropy control)",
                    bonus.entropy[-1] / past.entropy[-1], 1.2, 6.0, "ratio"))
    wide = cont({A + "clip_ratio_high": 0.28}, 4 * at)
    held = L.learning_trajectory({**cfg, A + "clip_ratio_high": 0.28}, sc, 4 * at, collapse_draw=math.inf)
    out.append(Fact(f"clip-higher 0.28 from step {at}: entropy at {4 * at}, share of a run with it from the start",
                    "clip-higher holds entropy; a collapsed policy regains some", "DAPO (Yu et al. 2025)",
                    wide.entropy[-1] / held.entropy[-1], 0.4, 0.999, "share"))
    return out


@dataclass(frozen=True)
class HeldOut:
    """A public step time the simulator was not calibrated on, and the simulator's noise-free figure for it.

    ``low``/``high`` bound the ratio simulator / public: the error found when the check was added (docs/sim.md,
    "Step time against public points it was not calibrated on") x/÷ 1.4, so a step-time model that moves by 2x
    leaves every band. A recalibration must not tune the simulator toward these points.
    """

    scenario: str  # a shipped scenario of ``scenarios/checks/``
    source: str
    public_s: float  # the published step time (s)
    low: float
    high: float
    value_s: float = 0.0  # the simulator's step time (s), noise-free, updates 3-5
    public_phases: tuple[float, float, float] | None = None  # gen / old_log_prob / update_actor, where published
    phases: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def ratio(self) -> float:
        return self.value_s / self.public_s

    @property
    def ok(self) -> bool:
        return self.low <= self.ratio <= self.high


NEMO_V04 = "NVIDIA-NeMo/RL docs/about/performance-summary.md, v0.4 (Megatron, on policy)"
VERL_ASYNC = "verl recipe/fully_async_policy/README.md, colocate sync (FSDP2 + vLLM)"
#: the held-out points: (scenario, source, public step s, band low, band high, published phase split or None)
HELD_OUT_POINTS: tuple[tuple[str, str, float, float, float, tuple[float, float, float] | None], ...] = (
    ("nemo-rl-llama3.1-8b-2x8-h100", NEMO_V04, 97.7, 1.45, 2.85, None),
    ("nemo-rl-qwen3-32b-4x8-h100", NEMO_V04, 393.0, 1.5, 3.0, None),
    ("nemo-rl-qwen3-30b-a3b-4x8-h100", NEMO_V04, 225.0, 2.35, 4.6, None),
    ("verl-dapo-qwen2.5-math-7b-28k-4x8-h20", VERL_ASYNC, 790.10, 1.0, 1.95, (357.41, 107.71, 269.80)),
    ("verl-dapo-qwen2.5-math-7b-28k-8x8-h20", VERL_ASYNC, 365.28, 1.4, 2.75, (150.72, 70.26, 133.41)),
)


def measure_held_out(perturb: int | None = None) -> list[HeldOut]:
    """The simulator's step time (the scenario's own config, noise-free, updates 3-5) on each held-out point."""
    out = []
    for name, source, public, low, high, split in HELD_OUT_POINTS:
        sc = load_scenario(name, perturb)
        p = step_phases(M.base_config(sc), sc)
        out.append(HeldOut(name, source, public, low, high, p["t_step"], split, (p["t_gen"], p["t_old"], p["t_update"])))
    return out


def format_held_out(points: list[HeldOut]) -> str:
    lines = ["| scenario | public step s (gen / old_log_prob / update) | sim step s (gen / old_log_prob / update) "
             "| sim / public | band | ok |", "|---|---|---|---|---|---|"]
    for h in points:
        pub = f"{h.public_s:.1f}" + (" ({:.0f} / {:.0f} / {:.0f})".format(*h.public_phases) if h.public_phases else "")
        sim = "{:.1f} ({:.0f} / {:.0f} / {:.0f})".format(h.value_s, *h.phases)
        lines.append(f"| {h.scenario} | {pub} | {sim} | {h.ratio:.2f} | [{h.low}, {h.high}] | {'yes' if h.ok else 'NO'} |")
    return "\n".join(lines)


def format_facts(facts: list[Fact]) -> str:
    lines = ["| fact | public | sim | band | ok |", "|---|---|---|---|---|"]
    for f in facts:
        lines.append(f"| {f.name} | {f.public} | {f.value:.3g} | [{f.low:.3g}, {f.high:.3g}] | {'yes' if f.ok else 'NO'} |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - a report for docs/sim.md
    import sys

    seed = int(sys.argv[1]) if len(sys.argv) > 1 else None
    print(format_facts(measure_facts(seed)))
    print()
    print(format_held_out(measure_held_out(seed)))
