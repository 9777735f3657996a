"""What the simulator models of a job: hardware, model architecture, workload shape, learning curve.

The types only (no file reading, no catalogue): ``Scenario`` (a verl GRPO job on a cluster) and
``MultiAgentScenario`` (a MARTI-style workflow of several agents), the GPU table and the hidden constants.
They sit at the bottom of the simulator so that every other part (the YAML loader in ``scenarios``, the
knob catalogue in ``catalogue``, the system and learning models) can use them without a circle. Every
number is documented, with its public source, in ``docs/sim.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mart.state.job import version_at_least

GIB = 1024**3


@dataclass(frozen=True)
class GPU:
    """One accelerator and its links (per-GPU effective figures, not datasheet peaks)."""

    name: str
    memory_gb: float  # capacity in GiB, what torch reports / 1024**3
    hbm_bw: float  # bytes/s actually reached by decode kernels (~75% of peak)
    bf16_flops: float  # dense bf16 peak, FLOP/s
    nvlink_bw: float  # intra-node collective bus bandwidth, bytes/s (effective)
    ib_bw: float  # inter-node collective bandwidth per GPU, bytes/s (effective)
    pcie_bw: float  # pinned host<->device copy bandwidth per GPU when all 8 copy at once, bytes/s
    train_eff: float = 0.55  # MFU a large dense model's FSDP training reaches (compute-poor GPUs reach more)
    interconnect: str = ""


#: The GPU table (datasheet memory, HBM bandwidth, dense bf16 FLOP/s, links); docs/sim.md gives sources.
#: ``train_eff`` is calibrated: H100 to MART's direction, H20 to verl's public Qwen2-7B log (MFU ~0.77),
#: the others placed by their FLOP/byte ridge point between those two.
GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU("H100-80GB", 80.0, 0.75 * 3.35e12, 989e12, 150e9, 22e9, 12e9, 0.55, "NVLink 4 (900 GB/s), 400 Gb/s IB"),
        GPU("H200", 141.0, 0.75 * 4.8e12, 989e12, 150e9, 22e9, 12e9, 0.58, "NVLink 4 (900 GB/s), 400 Gb/s IB"),
        GPU("H20", 96.0, 0.75 * 4.0e12, 148e12, 150e9, 22e9, 12e9, 0.87, "NVLink 4 (900 GB/s), 400 Gb/s IB"),
        GPU("A100-80GB", 80.0, 0.75 * 2.039e12, 312e12, 100e9, 11e9, 6e9, 0.62, "NVLink 3 (600 GB/s), 200 Gb/s IB"),
        GPU("A100-40GB", 40.0, 0.75 * 1.555e12, 312e12, 100e9, 11e9, 6e9, 0.62, "NVLink 3 (600 GB/s), 200 Gb/s IB"),
        GPU("L40S", 48.0, 0.75 * 0.864e12, 362e12, 12e9, 11e9, 6e9, 0.50, "PCIe Gen4 only (no NVLink), 200 Gb/s"),
        # DGX B200 datasheet: 180 GB HBM3e and 8 TB/s per GPU, 2.25 PFLOP/s dense BF16, NVLink 5 (1.8 TB/s), 400 Gb/s
        GPU("B200", 180.0, 0.75 * 8.0e12, 2250e12, 300e9, 22e9, 12e9, 0.50, "NVLink 5 (1.8 TB/s), 400 Gb/s IB"),
        # L4 datasheet: 24 GB GDDR6, 300 GB/s, 121 TFLOP/s dense BF16, PCIe Gen4 x16, no NVLink
        GPU("L4", 24.0, 0.75 * 0.3e12, 121e12, 12e9, 11e9, 6e9, 0.50, "PCIe Gen4 only (no NVLink), 200 Gb/s"),
        # AWS's A10G (the A10's cloud variant; A10 datasheet: 24 GB, 600 GB/s, 125 TFLOP/s dense BF16, Gen4 x16);
        # g5.48xlarge: 8 GPUs share 100 Gb/s of networking
        GPU("A10G", 24.0, 0.75 * 0.6e12, 125e12, 12e9, 1.2e9, 6e9, 0.58, "PCIe Gen4 only (no NVLink), 100 Gb/s per node"),
    )
}
H100_80G = GPUS["H100-80GB"]


@dataclass(frozen=True)
class ModelSpec:
    """Decoder-only dense transformer as far as memory and FLOPs go (Hugging Face ``config.json`` fields)."""

    name: str
    hf_path: str
    params: float  # total parameters (embeddings included)
    layers: int
    hidden: int
    intermediate: int
    kv_heads: int
    head_dim: int
    vocab: int
    heads: int = 0
    model_type: str = ""  # config.json's (qwen3, qwen2, llama, qwen3_moe); "" = not given
    tie_word_embeddings: bool = False
    experts: int = 0  # MoE: routed experts per layer (0 = dense)
    experts_per_tok: int = 0
    moe_intermediate: int = 0

    @property
    def active_params(self) -> float:
        """Parameters a token passes through: all of a dense model's, the routed experts' share of an MoE's."""
        if not self.experts:
            return self.params
        mlp_all = self.layers * self.experts * 3 * self.hidden * self.moe_intermediate
        return self.params - mlp_all * (1 - max(self.experts_per_tok, 1) / self.experts)

    def kv_bytes_per_rank_token(self, tp: Any) -> Any:
        """KV bytes per token on one TP rank: vLLM gives each rank max(1, kv_heads // TP) heads (a head is
        replicated on every rank when TP exceeds the KV heads)."""
        heads = np.maximum(1, self.kv_heads // np.maximum(np.asarray(tp, dtype=int), 1))
        return 2 * self.layers * heads * self.head_dim * 2

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V, every layer, bf16."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    @property
    def weight_bytes(self) -> float:
        return 2 * self.params  # bf16

    @property
    def size_factor(self) -> float:
        """Share of the GPU's training efficiency a model this size reaches (0.6B: 0.6, 8B: 0.92)."""
        return float(np.clip(0.6 + 0.32 * math.log(self.params / 0.6e9) / math.log(8.19 / 0.6), 0.45, 1.0))

    @property
    def cuda_graph_gb(self) -> float:
        """vLLM CUDA-graph pool at 256 sequences (outside gpu_memory_utilization): 0.6 GB (0.6B) .. 1.5 GB (8B)."""
        return float(np.clip(0.6 + 0.9 * math.log(self.params / 0.6e9) / math.log(8.19 / 0.6), 0.4, 3.0))


@dataclass(frozen=True)
class LearningProfile:
    """How the model's validation score responds to RL on the scenario's task (see docs/sim.md)."""

    score0: float  # validation mean@1 before training
    headroom: float  # score reachable above score0 with ideal settings and unlimited steps
    lr_opt: float  # learning rate at which progress per step saturates (1 update / step)
    tau_steps: float  # progress (in optimal-lr steps) for 63% of the headroom
    entropy0: float  # actor/entropy at step 1 (temperature 1)
    reward0: float  # critic/score/mean at step 1
    resp_len0: float  # mean response length (tokens, untruncated) at step 1
    resp_growth: float  # relative growth of the mean response length at full progress
    resp_cv: float = 0.7  # coefficient of variation of response lengths (lognormal)


@dataclass(frozen=True)
class SimConstants:
    """The simulator's hidden constants, as multipliers of their documented central values.

    ``perturbed(seed)`` draws each within the range in ``PERTURB_RANGES`` (docs/sim.md, "Model mismatch").
    """

    train_mfu: float = 1.0  # training MFU cap
    mfu_half_tokens: float = 1.0  # tokens per micro batch at half the MFU cap
    act_bytes: float = 1.0  # activation bytes per token (all layers)
    logits_bytes: float = 1.0  # logits bytes per token x vocab
    kv_bytes: float = 1.0  # KV cache bytes per token (paged-block waste, layout)
    offload_bw: float = 1.0  # host<->device copy rate of offloading
    decode_overhead: float = 1.0  # CPU cost per vLLM engine step and per sequence
    eager_launch: float = 1.0  # kernel-launch cost per layer without CUDA graphs
    decode_eff: float = 1.0  # share of HBM bandwidth and FLOPs decode kernels reach
    tail_cv: float = 1.0  # response-length spread (the long tail)
    collective_bw: float = 1.0  # NVLink / IB collective bandwidth


#: (low, high) of each ``SimConstants`` multiplier under ``perturb``; drawn log-uniformly.
PERTURB_RANGES: dict[str, tuple[float, float]] = {
    "train_mfu": (0.8, 1.15),
    "mfu_half_tokens": (0.6, 1.6),
    "act_bytes": (0.8, 1.02),  # above ~1.02 the public Qwen2-7B run would not fit its 96 GB cards
    "logits_bytes": (0.85, 1.05),
    "kv_bytes": (0.95, 1.15),
    "offload_bw": (0.6, 1.5),
    "decode_overhead": (0.7, 1.4),
    "eager_launch": (0.75, 1.3),
    "decode_eff": (0.8, 1.15),
    "tail_cv": (0.85, 1.2),
    "collective_bw": (0.7, 1.3),
}


def perturbed_constants(seed: int) -> SimConstants:
    """Hidden constants drawn log-uniformly within ``PERTURB_RANGES`` from ``seed`` (same seed, same draw)."""
    rng = np.random.default_rng([0x5EED, int(seed)])
    return SimConstants(**{k: float(math.exp(rng.uniform(math.log(lo), math.log(hi))))
                           for k, (lo, hi) in PERTURB_RANGES.items()})


@dataclass(frozen=True)
class Scenario:
    """A verl GRPO job on a cluster: what the simulator models and the baseline it starts from.

    Plain fields (``model``, ``gpu``, ``nnodes``, ``gpus_per_node``, the workload shape) describe the job;
    ``consts`` are the simulator's hidden constants; ``base_overrides`` the verl keys the user's job sets.
    """

    name: str
    model: ModelSpec
    gpu: GPU
    nnodes: int
    gpus_per_node: int
    train_batch_size: int
    rollout_n: int
    max_prompt_length: int
    max_response_length: int
    prompt_len_mean: float
    learning: LearningProfile
    val_size: int = 775  # AMC23 (40) + OlympiadBench (675) + AIME24 (30) + AIME25 (30)
    test_freq: int = 5
    description: str = ""
    val_benchmarks: tuple[tuple[str, float], ...] = field(
        default=(("amc23", 1.35), ("olympiadbench", 1.0), ("aime24", 0.45), ("aime25", 0.4))
    )
    """Per-benchmark (name, difficulty multiplier of the mean score) for the val-aux metrics."""
    base_overrides: tuple[tuple[str, Any], ...] = ()
    consts: SimConstants = field(default_factory=SimConstants)
    perturb_seed: int | None = None
    rollout_engine: str = "vllm-v1"  # vllm-v0: the pre-2025 engine, ~3x the CPU cost per engine step
    verl_version: str = "0.9.1"  # whose defaults and rules the job runs under
    vllm_version: str = "0.11.0"  # since 0.21 vLLM counts its CUDA graphs inside gpu_memory_utilization
    noise_scale: float = 1.0
    """Multiplier of the timing (throughput) measurement noise, ``trial.TIMING_NOISE``: 0 measures every step
    without jitter, 3 triples it (``bench/noise.py``). The draws stay the same, only scaled, so two scales of
    one seed see the same noise; memory readings and the workload's own variation are not scaled."""

    @property
    def graphs_inside_util(self) -> bool:
        """vLLM >= 0.21 profiles the CUDA-graph capture memory inside ``gpu_memory_utilization`` (before: on top)."""
        return version_at_least(self.vllm_version, (0, 21))

    @property
    def n_gpus(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def resp_cv(self) -> float:
        """Spread of response lengths (the long tail), hidden-constant factor included."""
        return self.learning.resp_cv * self.consts.tail_cv

    @property
    def mean_response_length(self) -> float:
        return self.learning.resp_len0

    def with_memory(self, memory_gb: float) -> Scenario:
        return replace(self, gpu=replace(self.gpu, memory_gb=float(memory_gb)))

    def with_noise(self, scale: float) -> Scenario:
        """This job with its timing measurement noise scaled (``noise_scale``)."""
        if not scale >= 0:
            raise ValueError(f"`noise_scale` must be >= 0, but got {scale!r}.")
        return replace(self, noise_scale=float(scale))

    def perturbed(self, seed: int | None) -> Scenario:
        """This job with the hidden constants redrawn from ``seed`` (``None``: the central values)."""
        if seed is None:
            return replace(self, consts=SimConstants(), perturb_seed=None)
        return replace(self, consts=perturbed_constants(seed), perturb_seed=int(seed))

    # the model engineer's describe_job() reads these plain fields
    def job(self) -> dict[str, Any]:
        """The job as plain data: model architecture, GPU, cluster shape, workload (no hidden constants)."""
        m, g = self.model, self.gpu
        return {
            "name": self.name,
            "model": {"name": m.name, "num_parameters": m.params, "num_hidden_layers": m.layers,
                      "hidden_size": m.hidden, "intermediate_size": m.intermediate, "num_attention_heads": m.heads,
                      "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim, "vocab_size": m.vocab,
                      "model_type": m.model_type or None, "tie_word_embeddings": m.tie_word_embeddings,
                      **({"num_experts": m.experts, "num_experts_per_tok": m.experts_per_tok,
                          "moe_intermediate_size": m.moe_intermediate} if m.experts else {})},
            "versions": {"verl": self.verl_version, "vllm": self.vllm_version},
            "cluster": {"gpu": g.name, "memory_gb": g.memory_gb, "hbm_tb_s": round(g.hbm_bw / 0.75 / 1e12, 3),
                        "bf16_tflops": g.bf16_flops / 1e12, "interconnect": g.interconnect,
                        "nodes": self.nnodes, "gpus_per_node": self.gpus_per_node},
            "workload": {"train_batch_size": self.train_batch_size, "rollout_n": self.rollout_n,
                         "max_prompt_length": self.max_prompt_length, "max_response_length": self.max_response_length,
                         "mean_response_length": self.learning.resp_len0, "mean_prompt_length": self.prompt_len_mean},
            "base_config": dict(self.base_overrides),
        }



@dataclass(frozen=True)
class MultiAgentScenario(Scenario):
    """A MARTI-style job: ``num_agents`` agents of the scenario's model, each a worker group of
    ``nnodes x gpus_per_node`` GPUs (the single-agent fields describe one agent's group)."""

    num_agents: int = 2
    workflow: str = "debate"  # debate | chain
    num_rounds: int = 2  # debate rounds (a chain has one pass through its agents)
    max_others: int = 5  # MARTI's debate workflow_args
    contain_self: bool = True
    placement: str = "own"  # own: each agent its own GPUs (in parallel); shared: the agents take turns
    template_tokens: float = 40.0  # wrapper text around each answer shown in a prompt
    debate_gain0: float = 0.02  # team gain of the untrained workflow over its agents' mean (assumption)
    debate_gain_trained: float = 0.06  # extra team gain once the agents are fully trained with shaping

    @property
    def n_gpus_agent(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def total_gpus(self) -> int:
        return self.n_gpus_agent * (self.num_agents if self.placement == "own" else 1)

    @property
    def shown_answers(self) -> int:
        """Answers a round-2+ prompt shows per earlier round (others, plus its own with contain_self)."""
        if self.workflow == "chain":
            return 1
        return min(self.max_others, self.num_agents - 1) + (1 if self.contain_self else 0)

    def job(self) -> dict[str, Any]:
        out = super().job()
        out["multi_agent"] = {"num_agents": self.num_agents, "workflow": self.workflow, "num_rounds": self.num_rounds,
                              "placement": self.placement, "total_gpus": self.total_gpus}
        return out



def is_multi_agent(sc: Any) -> bool:
    return isinstance(sc, MultiAgentScenario)
