"""Named cluster scenarios of the simulator: hardware, model architecture, workload shape, learning curve.

Every number here is an assumption documented (with its public source) in ``docs/sim.md``. A scenario is
immutable; ``get_scenario(name)`` raises a ``ValueError`` naming the known ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

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
    pcie_bw: float  # host<->device copy bandwidth per GPU when all 8 copy at once, bytes/s


H100_80G = GPU(
    name="H100-SXM-80GB",
    memory_gb=80.0,
    hbm_bw=0.75 * 3.35e12,
    bf16_flops=989e12,
    nvlink_bw=150e9,
    ib_bw=22e9,
    pcie_bw=12e9,
)


@dataclass(frozen=True)
class ModelSpec:
    """Decoder-only transformer (Qwen3 dense) as far as memory and FLOPs go."""

    name: str
    hf_path: str
    params: float  # total parameters (embeddings included)
    layers: int
    hidden: int
    intermediate: int
    kv_heads: int
    head_dim: int
    vocab: int
    # training-kernel efficiency: MFU reached with very large micro batches, and the tokens per micro
    # batch at which half of it is reached (small models need more tokens to fill the GPU)
    mfu_max: float
    mfu_half_tokens: float
    cuda_graph_gb: float  # vLLM CUDA-graph pool (outside gpu_memory_utilization)

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V, every layer, bf16."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    @property
    def weight_bytes(self) -> float:
        return 2 * self.params  # bf16


QWEN3_8B = ModelSpec(
    name="qwen3-8b",
    hf_path="Qwen/Qwen3-8B",
    params=8.19e9,
    layers=36,
    hidden=4096,
    intermediate=12288,
    kv_heads=8,
    head_dim=128,
    vocab=151936,
    mfu_max=0.50,
    mfu_half_tokens=1500.0,
    cuda_graph_gb=1.5,
)

QWEN3_06B = ModelSpec(
    name="qwen3-0.6b",
    hf_path="Qwen/Qwen3-0.6B-Base",
    params=0.596e9,
    layers=28,
    hidden=1024,
    intermediate=3072,
    kv_heads=8,
    head_dim=128,
    vocab=151936,
    mfu_max=0.32,
    mfu_half_tokens=6000.0,
    cuda_graph_gb=0.6,
)


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
class Scenario:
    """A verl GRPO job on a cluster: what the simulator models and the baseline it starts from."""

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

    @property
    def n_gpus(self) -> int:
        return self.nnodes * self.gpus_per_node

    def with_memory(self, memory_gb: float) -> Scenario:
        return replace(self, gpu=replace(self.gpu, memory_gb=float(memory_gb)))


LEARN_8B = LearningProfile(
    score0=0.420,
    headroom=0.100,
    lr_opt=4e-6,
    tau_steps=40.0,
    entropy0=0.45,
    reward0=0.46,
    resp_len0=900.0,
    resp_growth=0.35,
)

LEARN_06B = LearningProfile(
    score0=0.105,
    headroom=0.030,
    lr_opt=6e-6,
    tau_steps=40.0,
    entropy0=0.85,
    reward0=0.17,
    resp_len0=900.0,
    resp_growth=0.7,
)


def _scenario(name: str, model: ModelSpec, learning: LearningProfile, nnodes: int, max_response: int) -> Scenario:
    return Scenario(
        name=name,
        model=model,
        gpu=H100_80G,
        nnodes=nnodes,
        gpus_per_node=8,
        train_batch_size=1024,
        rollout_n=8,
        max_prompt_length=1024,
        max_response_length=max_response,
        prompt_len_mean=250.0,
        learning=learning,
        description=f"{model.hf_path} GRPO on math, {nnodes}x8 H100-80GB, 256 prompts x 8 samples per step",
    )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        _scenario("qwen3-8b-1x8", QWEN3_8B, LEARN_8B, 1, 2048),
        _scenario("qwen3-8b-2x8", QWEN3_8B, LEARN_8B, 2, 2048),
        _scenario("qwen3-0.6b-1x8", QWEN3_06B, LEARN_06B, 1, 4096),
        _scenario("qwen3-0.6b-2x8", QWEN3_06B, LEARN_06B, 2, 4096),
    )
}


def get_scenario(name: str) -> Scenario:
    """The named scenario.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown sim scenario {name!r}: use one of {sorted(SCENARIOS)}") from None
