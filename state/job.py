"""What a user knows about an RL job before tuning it: the model's shape, the hardware, the workload.

The performance/memory model of the agents (``mart.nodes.agents.job_model``) starts from this and the
measured profile. Backends describe their job with ``Backend.describe_job()`` (``None`` = unknown: the
agents then fall back to profile-only heuristics). Every field is a public fact of the job: a Hugging
Face ``config.json``, the GPU's datasheet, the Hydra config; nothing here is a tuning constant.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator


class ModelShape(BaseModel):
    """A decoder-only transformer as far as memory and FLOPs go (Hugging Face ``config.json`` names)."""

    num_hidden_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int | None = Field(None, gt=0, description="GQA KV heads; None = num_attention_heads")
    intermediate_size: int | None = Field(None, gt=0, description="FFN width; None = 4 x hidden_size")
    vocab_size: int = Field(gt=0)
    head_dim: int | None = Field(None, gt=0, description="None = hidden_size / num_attention_heads")
    params: float | None = Field(None, gt=0, description="total parameters; None = counted from the shape")
    gated_mlp: bool = Field(True, description="SwiGLU-style MLP (3 matrices) as in Llama/Qwen; False = GPT-2 MLP")
    tie_word_embeddings: bool = False
    model_type: str | None = Field(None, description="config.json's model_type (qwen3, qwen2, llama, qwen3_moe): "
                                   "lets the memory probe build the real module; None = the textbook count only")
    num_experts: int | None = Field(None, gt=0, description="MoE: routed experts per MoE layer (None = dense)")
    num_experts_per_tok: int | None = Field(None, gt=0, description="MoE: experts each token is routed to")
    moe_intermediate_size: int | None = Field(None, gt=0, description="MoE: one expert's FFN width")

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def ffn(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def dhead(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def n_params(self) -> float:
        if self.params:
            return float(self.params)
        return self._count(self.num_experts or 0)

    @property
    def active_params(self) -> float:
        """Parameters one token passes through (= ``n_params`` for a dense model; the routed experts' share of an
        MoE's): what its FLOPs scale with, while its memory holds every expert."""
        if not self.num_experts:
            return self.n_params
        share = self._count(self.num_experts_per_tok or 1) / self._count(self.num_experts)
        return self.n_params * share

    def _count(self, experts: int) -> float:
        h, f, L, v = self.hidden_size, self.ffn, self.num_hidden_layers, self.vocab_size
        attn = h * self.num_attention_heads * self.dhead * 2 + h * self.kv_heads * self.dhead * 2
        mats = 3 if self.gated_mlp else 2
        if self.num_experts:  # experts of moe_intermediate_size plus the router
            mlp = experts * mats * h * (self.moe_intermediate_size or f) + h * self.num_experts
        else:
            mlp = mats * h * f
        emb = v * h * (1 if self.tie_word_embeddings else 2)
        return float(L * (attn + mlp + 2 * h) + emb)

    def arch(self) -> dict[str, Any]:
        """The config.json fields the memory probe builds the module from (``model_type`` None: not buildable)."""
        out = {k: getattr(self, k) for k in ("model_type", "num_hidden_layers", "hidden_size", "intermediate_size",
                                              "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                                              "tie_word_embeddings", "num_experts", "num_experts_per_tok",
                                              "moe_intermediate_size") if getattr(self, k) is not None}
        out["hidden_act"] = "silu" if self.gated_mlp else "gelu"
        return out

    @classmethod
    def from_hf_config(cls, data: dict[str, Any]) -> "ModelShape":
        """From a Hugging Face ``config.json`` dict (text configs nested under ``text_config`` too)."""
        data = data.get("text_config", data) if isinstance(data.get("text_config"), dict) else data
        keep = {k: data[k] for k in cls.model_fields if k in data and data[k] is not None}
        act = str(data.get("hidden_act", "silu")).lower()
        keep.setdefault("gated_mlp", act in ("silu", "swiglu", "swish") or "llama" in str(data.get("model_type", "")))
        return cls(**keep)

    @classmethod
    def from_config_file(cls, path: str | Path) -> "ModelShape":
        """Read ``<model dir>/config.json`` (or the file itself).

        Raises:
            ValueError: the file is missing, not JSON, or lacks a required field (named in the message).
        """
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read the model config {p}: {e}") from None
        try:
            return cls.from_hf_config(data)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            raise ValueError(f"model config {p}: {problems}") from None


class Hardware(BaseModel):
    """One accelerator (per device). Unknown figures are None: the model then uses a generic prior and
    calibrates its time scale on the measured profile."""

    name: str = "gpu"
    memory_gb: float = Field(gt=0, description="capacity per device in GiB (the margin rule's reference)")
    hbm_bandwidth: float | None = Field(None, gt=0, description="bytes/s (datasheet peak)")
    bf16_flops: float | None = Field(None, gt=0, description="dense bf16 FLOP/s (datasheet peak)")
    intra_node_bandwidth: float | None = Field(None, gt=0, description="collective bus bytes/s within a node")
    inter_node_bandwidth: float | None = Field(None, gt=0, description="collective bytes/s per device across nodes")
    host_bandwidth: float | None = Field(None, gt=0, description="host<->device copy bytes/s per device (PCIe)")
    pcie_gen: int | None = Field(None, ge=1, le=7, description="the host link's PCIe generation (datasheet): each "
                                 "generation doubles the rate; used when host_bandwidth is not given")
    cpu: bool = Field(False, description="a CPU emulating a device (local backend): no vLLM, no CUDA graphs")


class Workload(BaseModel):
    """The job's shape per step (verl's data/rollout keys)."""

    train_batch_size: int = Field(gt=0, description="prompts per step")
    rollout_n: int = Field(1, gt=0)
    max_prompt_length: int = Field(gt=0)
    max_response_length: int = Field(gt=0)
    prompt_length_mean: float | None = Field(None, gt=0, description="None = half of max_prompt_length")
    response_length_mean: float | None = Field(None, gt=0, description="None = from the profile")
    uses_reference: bool = Field(False, description="a KL term needs the reference policy's log-prob pass")


class JobDescription(BaseModel):
    """Model, hardware, cluster shape and workload of one RL job."""

    model: ModelShape
    hardware: Hardware
    nnodes: int = Field(1, gt=0)
    gpus_per_node: int = Field(1, gt=0)
    workload: Workload
    engine: str = Field("vllm", description="rollout engine: vllm (memory-share semantics) or hf (plain generate)")
    logits_path: str = Field("fused", description="the log-prob pass's logits path: fused (flash-attn's fused "
                             "cross-entropy, as verl's images run it) or fp32 (verl's non-fused path: fp32 copies)")
    vllm_version: str | None = Field(None, description="the vLLM release the job runs (e.g. 0.21.0): since 0.21 "
                                     "its CUDA graphs sit inside gpu_memory_utilization; None = before that")
    agents: int = Field(1, gt=0, description="trained policies of the job: 1, or a multi-agent team (MARTI-style)")
    agents_per_device: int | None = Field(
        None, gt=0, description="policy copies resident on each device, each with its own weights, gradients, "
        "optimizer state and reference; None = every agent shares every device (the local workload: one process); "
        "1 = each agent owns its devices (the shape above is one agent's)")

    @property
    def n_gpus(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def resident_policies(self) -> int:
        """Policy copies whose static memory sits on each device. The agents of a team run their phases one
        after another, so activations, KV cache and logits peak for one agent at a time."""
        return self.agents_per_device or self.agents

    @model_validator(mode="after")
    def _check(self) -> "JobDescription":
        if self.logits_path not in ("fused", "fp32"):
            raise ValueError(f"logits_path must be 'fused' or 'fp32', got {self.logits_path!r}")
        if self.engine not in ("vllm", "hf"):
            raise ValueError(f"engine must be 'vllm' or 'hf', got {self.engine!r}")
        if self.agents_per_device is not None and self.agents_per_device > self.agents:
            raise ValueError(f"agents_per_device ({self.agents_per_device}) exceeds agents ({self.agents})")
        return self


#: Datasheet figures of common accelerators (dense bf16 FLOP/s, HBM bytes/s, host link PCIe generation), for jobs
#: that name the GPU only. Sources: NVIDIA H100/H200/A100/H20/L40S datasheets (Hopper: PCIe Gen5 x16; A100 and
#: L40S: Gen4 x16); NVIDIA's DGX B200 / HGX B200 datasheet (B200: 2.25 PFLOP/s dense FP16/BF16, i.e. half the 4.5
#: sparse figure; 8 TB/s HBM3e; 180 GB in the DGX B200's 1,440 GB); NVIDIA L4 datasheet (121 TFLOP/s dense BF16 = half
#: of 242 with sparsity, 300 GB/s, 24 GB, PCIe Gen4 x16); NVIDIA A10 datasheet for AWS's A10G, its cloud variant
#: (125 TFLOP/s dense BF16 = half of 250, 600 GB/s, 24 GB, Gen4 x16; AWS publishes no tensor figure of its own).
KNOWN_GPUS: dict[str, tuple[float, float, int]] = {
    "B200": (2250e12, 8.0e12, 5),
    "L4": (121e12, 0.3e12, 4),
    "A10G": (125e12, 0.6e12, 4),
    "H100": (989e12, 3.35e12, 5),
    "H200": (989e12, 4.8e12, 5),
    "H800": (989e12, 3.35e12, 5),
    "H20": (148e12, 4.0e12, 5),
    "A100": (312e12, 2.0e12, 4),
    "A800": (312e12, 2.0e12, 4),
    "L40S": (362e12, 0.864e12, 4),
}


#: datasheet memory per device, GB (the same sources); A100 by the name's "40GB"/"80GB"
GPU_MEMORY_GB: dict[str, float] = {"B200": 180.0, "H100": 80.0, "H200": 141.0, "H800": 80.0, "H20": 96.0,
                                   "A100": 80.0, "A800": 80.0, "L40S": 48.0, "L4": 24.0, "A10G": 24.0}


def gpu_memory(name: str) -> float | None:
    """Datasheet memory (GB) of a GPU named like ``H100-80GB`` or ``A100-40GB`` (None if unknown): a size in the
    name wins over the table."""
    size = re.search(r"(\d+)\s*GB", name.upper())
    if size:
        return float(size.group(1))
    for key, gb in sorted(GPU_MEMORY_GB.items(), key=lambda kv: -len(kv[0])):  # L40S before L4
        if key in name.upper().replace("-", " ").split() or name.upper().startswith(key):
            return gb
    return None


def known_gpu(name: str) -> tuple[float, float, int] | None:
    """The datasheet row of a GPU named like ``NVIDIA H100 80GB HBM3`` or ``A100-40GB`` (None if unknown)."""
    upper = name.upper()
    for key, row in sorted(KNOWN_GPUS.items(), key=lambda kv: -len(kv[0])):  # L40S before L4
        if key in upper.replace("-", " ").split() or upper.startswith(key) or f" {key}" in upper:
            return row
    return None


def hardware_from_name(name: str, memory_gb: float) -> Hardware:
    """A ``Hardware`` for a GPU named like ``NVIDIA H100 80GB HBM3`` (unknown names: figures None)."""
    row = known_gpu(name)
    if row is None:
        return Hardware(name=name, memory_gb=memory_gb)
    flops, bw, gen = row
    return Hardware(name=name, memory_gb=memory_gb, bf16_flops=flops, hbm_bandwidth=bw, pcie_gen=gen)


__all__ = ["GPU_MEMORY_GB", "Hardware", "JobDescription", "KNOWN_GPUS", "gpu_memory", "ModelShape", "Workload", "hardware_from_name", "known_gpu"]


def version_at_least(version: str | None, floor: tuple[int, ...]) -> bool:
    """``"0.21.1" >= (0, 21)``: a vLLM or verl version against the release a rule changed in; None or an unreadable
    version counts as old."""
    if not version:
        return False
    parts = []
    for piece in str(version).split(".")[: len(floor)]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            return False
        parts.append(int(digits))
    return tuple(parts) >= floor
