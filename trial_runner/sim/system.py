"""System model: stage-1 knobs -> phase times and peak memory per phase of one GRPO step.

Pure and vectorised: every knob may be a numpy array (broadcast together), so ``model.ground_truth``
evaluates whole grids at once; a single trial passes scalars. All times are seconds, all memory GiB.
The formulas and the public sources of their constants are in ``docs/sim.md`` ("System model").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mart.state.verl_keys import ACTOR as A
from mart.state.verl_keys import MODEL as M
from mart.state.verl_keys import REF
from mart.state.verl_keys import ROLLOUT as R
from mart.trial_runner.sim import memory as torch_memory
from mart.trial_runner.sim.job import GIB, Scenario

#: knob name in this module -> (verl key, default when the config lacks it)
SYSTEM_KEYS: dict[str, tuple[str, Any]] = {
    "util": (R + "gpu_memory_utilization", 0.5),
    "tp": (R + "tensor_model_parallel_size", 2),
    "max_num_seqs": (R + "max_num_seqs", 256),
    "mnbt": (R + "max_num_batched_tokens", 8192),
    "chunked": (R + "enable_chunked_prefill", True),
    "prefix": (R + "enable_prefix_caching", True),
    "eager": (R + "enforce_eager", False),
    "free_cache": (R + "free_cache_engine", True),
    "lp_micro": (R + "log_prob_micro_batch_size_per_gpu", None),
    "ref_micro": (REF + "log_prob_micro_batch_size_per_gpu", None),
    "ppo_micro": (A + "ppo_micro_batch_size_per_gpu", None),
    "dyn": (A + "use_dynamic_bsz", False),
    "tok_cap": (A + "ppo_max_token_len_per_gpu", 16384),
    "sp": (A + "ulysses_sequence_parallel_size", 1),
    "fsdp2": (A + "strategy", "fsdp"),
    "param_off": (A + "fsdp_config.param_offload", False),
    "opt_off": (A + "fsdp_config.optimizer_offload", False),
    "ref_off": (REF + "fsdp_config.param_offload", False),
    "grad_ckpt": (M + "enable_gradient_checkpointing", True),
    "act_off": (M + "enable_activation_offload", False),
    "remove_pad": (M + "use_remove_padding", True),
    "ent_chunk": (A + "entropy_from_logits_with_chunking", False),
    "ent_ckpt": (A + "entropy_checkpointing", False),
    "balance": ("trainer.balance_batch", True),
}


def knobs_from_config(config: dict[str, Any]) -> dict[str, float]:
    """The system knobs of a flat verl config as numbers (bools as 0/1, fsdp2 as 0/1, null micro -> 0)."""
    out: dict[str, float] = {}
    for name, (key, default) in SYSTEM_KEYS.items():
        value = config.get(key, default)
        if name == "fsdp2":
            out[name] = 1.0 if str(value) == "fsdp2" else 0.0
        elif value is None:
            out[name] = 0.0
        elif isinstance(value, str):
            out[name] = 1.0 if value.lower() in ("true", "1", "yes") else (0.0 if value.lower() in ("false", "0", "no") else float(value))
        else:
            out[name] = float(value)
    # verl's yaml interpolates the log-prob token caps from the actor's unless a job sets them
    for name, key in (("lp_tok_cap", R + "log_prob_max_token_len_per_gpu"), ("ref_tok_cap", REF + "log_prob_max_token_len_per_gpu")):
        cap = config.get(key)
        out[name] = float(cap) if cap is not None else out["tok_cap"]
    return out


@dataclass(frozen=True)
class StepWorkload:
    """What one step has to process (set by the learning state, not by system knobs)."""

    seqs: int  # train_batch_size x n
    n: int  # samples per prompt
    prompt_mean: float
    prompt_max: float  # longest prompt in the step
    resp_mean: float  # mean response length (truncated at max_response_length)
    resp_std: float
    resp_max: float  # longest response in the step
    resp_mu: float  # lognormal parameters of the (untruncated) response lengths
    resp_sigma: float
    max_prompt_length: int
    max_response_length: int
    uses_ref: bool
    mini_batch: int  # prompts per optimizer step
    ppo_epochs: int
    entropy_in_update: bool  # entropy_coeff != 0

    @property
    def seq_mean(self) -> float:
        return self.prompt_mean + self.resp_mean

    @property
    def tokens(self) -> float:
        return self.seqs * self.seq_mean


# ---------------------------------------------------------------------------------------------- rollout
# vLLM V1 engine-step costs (documented in docs/sim.md): CPU scheduling/sampling per step and per sequence,
# CUDA-graph replay vs eager kernel launches, TP all-reduce latency per layer.
T_SCHED_S = 8e-3
T_SCHED_PER_SEQ_S = 10e-6
# vLLM V0 (before 2025): Python scheduler, sampler and output processing per step and per sequence - the
# CPU overhead the V0.6 and V1 announcements describe (GPU idle most of a decode step at small models)
V0_SCHED_S = 15e-3
V0_SCHED_PER_SEQ_S = 60e-6
T_LAUNCH_PER_LAYER_S = 400e-6  # ~20 kernels x ~10 us of launch + Python per decoder layer, eager
EAGER_EXPOSED = 0.9  # share of the eager launch time the GPU sits idle
T_GRAPH_REPLAY_S = 0.3e-3
CUDA_GRAPH_MAX_BATCH = 512
T_ALLREDUCE_LAT_S = 8e-6
DECODE_MFU = 0.5
PREFILL_MFU = 0.55
VLLM_NON_TORCH_GB = 0.4
CUDA_CONTEXT_GB = 0.6


def kv_bytes(sc: Scenario) -> float:
    """KV cache bytes per token (bf16 K and V of every layer, x the hidden paged-layout factor)."""
    return sc.model.kv_bytes_per_token * sc.consts.kv_bytes


def _upper_quantile_z(p: np.ndarray) -> np.ndarray:
    """z with P(Z > z) = p for small p (Abramowitz & Stegun 26.2.23, |error| < 4.5e-4)."""
    p = np.clip(p, 1e-12, 0.5)
    t = np.sqrt(-2.0 * np.log(p))
    return t - (2.515517 + 0.802853 * t + 0.010328 * t * t) / (1 + 1.432788 * t + 0.189269 * t * t + 0.001308 * t**3)


def decode_costs(sc: Scenario, k: dict, c: np.ndarray, ctx: float) -> tuple[np.ndarray, np.ndarray]:
    """(fixed seconds per vLLM engine step, extra seconds per generated token) at concurrency ``c``.

    Fixed: CPU scheduling/sampling, kernel launches (CUDA-graph replay or eager), reading the weight shard
    once, TP all-reduce latency. Per token: per-sequence CPU work, reading the sequence's KV cache
    (decode is memory-bandwidth-bound), TP all-reduce volume, and GEMM compute beyond the weight read
    once the batch is large enough to be compute-bound.
    """
    m, g, cs = sc.model, sc.gpu, sc.consts
    tp = k["tp"]
    hbm = g.hbm_bw * cs.decode_eff
    eager_like = np.maximum(k["eager"], (c > CUDA_GRAPH_MAX_BATCH).astype(float))
    weights = m.weight_bytes / tp / hbm
    tp_lat = (tp > 1) * m.layers * 2 * T_ALLREDUCE_LAT_S * np.log2(np.maximum(tp, 2))
    # without CUDA graphs the GPU waits while the CPU launches each layer's ~20 short kernels one by one
    # (eager PyTorch, no torch.compile); most of that launch time is exposed
    eager_launch = m.layers * T_LAUNCH_PER_LAYER_S * cs.eager_launch * EAGER_EXPOSED
    v0 = sc.rollout_engine == "vllm-v0"
    sched, per_seq = (V0_SCHED_S, V0_SCHED_PER_SEQ_S) if v0 else (T_SCHED_S, T_SCHED_PER_SEQ_S)
    fixed = sched * cs.decode_overhead + weights + tp_lat + eager_like * eager_launch + (1 - eager_like) * T_GRAPH_REPLAY_S
    kv = ctx * m.kv_bytes_per_rank_token(tp) * cs.kv_bytes / hbm  # each rank reads its own heads
    tp_bw = (tp > 1) * m.layers * 2 * m.hidden * 2 / (g.nvlink_bw * cs.collective_bw)
    compute = np.maximum(0.0, 2 * m.active_params / tp / (g.bf16_flops * DECODE_MFU * cs.decode_eff) - weights / np.maximum(c, 1))
    return fixed, per_seq * cs.decode_overhead + kv + tp_bw + compute


def rollout_phase(sc: Scenario, k: dict, w: StepWorkload, seqs: float | None = None) -> dict[str, np.ndarray]:
    """Generation time and memory of the rollout phase (``seqs`` overrides the sequence count: validation)."""
    m, g = sc.model, sc.gpu
    n_gpus = sc.n_gpus
    tp = np.asarray(k["tp"], dtype=float)
    engines = n_gpus / tp
    seqs_total = w.seqs if seqs is None else seqs
    per_engine = seqs_total / engines

    # memory: the actor's resident state stays on the GPU during rollout unless offloaded (colocated workers)
    actor_params = (1 - k["param_off"]) * 4 * m.params / n_gpus / GIB
    optim = (1 - k["opt_off"]) * 8 * m.params / n_gpus / GIB
    ref = (1 - k["ref_off"]) * 2 * m.params / n_gpus / GIB * float(w.uses_ref)
    graphs = (1 - k["eager"]) * m.cuda_graph_gb * np.minimum(k["max_num_seqs"], CUDA_GRAPH_MAX_BATCH) / 256.0
    vllm = k["util"] * sc.gpu.memory_gb
    # vLLM >= 0.21 counts its CUDA graphs inside the memory share (they take KV cache); before, on top of it
    inside = 1.0 if sc.graphs_inside_util else 0.0
    mem = actor_params + optim + ref + graphs * (1 - inside) + vllm + CUDA_CONTEXT_GB

    # KV cache pool per GPU = vLLM budget - weights shard - activation workspace - non-torch memory
    act_ws = (k["mnbt"] * (12 * m.hidden + 6 * m.intermediate) / tp + k["max_num_seqs"] * m.vocab * 4) / GIB
    kv_pool_gb = vllm - m.weight_bytes / tp / GIB - act_ws - VLLM_NON_TORCH_GB - graphs * inside
    # per engine: each TP rank holds max(1, kv_heads // TP) heads of every token (replicated beyond the KV heads)
    kv_rank = m.kv_bytes_per_rank_token(tp) * sc.consts.kv_bytes
    kv_tokens = np.maximum(kv_pool_gb, 0) * GIB / kv_rank
    max_model_len = w.max_prompt_length + w.max_response_length
    kv_fail = kv_tokens < max_model_len

    # concurrency: max_num_seqs, the token budget per engine step, the sequences it has, and KV capacity
    cv2 = (w.resp_std / max(w.resp_mean, 1.0)) ** 2
    ctx_run = w.prompt_mean + w.resp_mean * (1 + cv2) / 2  # mean context a generated token attends to
    c_req = np.minimum(np.minimum(k["max_num_seqs"], k["mnbt"]), per_engine)
    c_kv = np.maximum(kv_tokens / ctx_run, 1.0)
    c_eff = np.maximum(np.minimum(c_req, c_kv), 1.0)
    preempt = np.clip(1 - c_kv / c_req, 0, 1)  # share of wanted concurrency evicted -> recompute

    # prefill: compute-bound; prefix caching shares a prompt's prefill across its n samples
    prefill_tokens = per_engine * w.prompt_mean / np.where(k["prefix"] > 0, w.n, 1)
    prefill_iters = prefill_tokens / np.maximum(np.where(k["chunked"] > 0, k["mnbt"] - c_eff, k["mnbt"]), 64)
    t_prefill = prefill_tokens * 2 * m.active_params / tp / (g.bf16_flops * PREFILL_MFU) + prefill_iters * T_SCHED_S
    t_prefill = t_prefill * np.where(k["chunked"] > 0, 1.0, 1.15)  # unchunked prefill stalls decode

    # decode (continuous batching, synchronous step): while sequences queue, c_eff run; then the last wave
    # drains, and the step ends with its longest response. Engine steps x fixed cost + tokens x token cost.
    tokens = per_engine * w.resp_mean
    queue_iters = np.maximum(0.0, per_engine - c_eff) * w.resp_mean / c_eff
    z = _upper_quantile_z(0.5 / c_eff)
    drain = np.minimum(np.exp(w.resp_mu + w.resp_sigma * z), w.max_response_length)
    iters = np.maximum(queue_iters + drain, 0.5 * queue_iters + w.resp_max)
    fixed, per_token = decode_costs(sc, k, c_eff, ctx_run)
    over_graph = (c_eff > CUDA_GRAPH_MAX_BATCH) * (1 - k["eager"]) * (queue_iters + w.resp_mean)
    # above the largest captured batch vLLM runs its torch.compile-d graph pieces: ~30% of the eager cost
    launch_extra = over_graph * (0.3 * m.layers * T_LAUNCH_PER_LAYER_S * sc.consts.eager_launch * EAGER_EXPOSED)
    t_decode = iters * fixed + launch_extra + tokens * per_token * (1 + 0.5 * preempt)
    straggle = 1 + 0.015 * np.log2(np.maximum(engines, 1))  # slowest engine of many
    t_gen = (t_prefill + t_decode) * straggle
    return {
        "t_gen": t_gen,
        "mem_gen": mem,
        "kv_fail": kv_fail,
        "kv_pool_gb": kv_pool_gb,
        "concurrency": c_eff,
        "preempt": preempt,
        "decode_iters": iters,
        "vllm_gb": vllm + graphs,
    }


# ---------------------------------------------------------------------------------------------- training
T_MICRO_PER_LAYER_FWD_S = 0.25e-3  # python, hooks and kernel launches per layer and micro batch (forward)
PAGEABLE_SHARE = 0.25  # verl offloads with .to("cpu"): pageable copies reach ~1/4 of pinned PCIe bandwidth
OFFLOAD_SYNC_S = 0.3  # synchronise + empty_cache + re-allocation around each load/offload
#: bytes x vocab per token that verl's log-prob path with flash-attn's fused cross-entropy (verl's images) keeps below
#: the non-fused fp32 path torch's accounting measured: 10 -> 6 in the forward (bf16 logits, the entropy's bf16
#: softmax), 12 -> 4 in the update (bf16 logits and their in-place gradient)
FUSED_LOGITS_SAVING = {"logprob": 4.0, "update": 8.0}
FSDP_FRAGMENTATION = 1.08  # FSDP1 allocator overhead on activations; FSDP2 has none
PACKING_EFFICIENCY = 0.92  # dynamic bsz fills ~92% of the token cap


def _micro_batches(k: dict, seqs_gpu: float, w: StepWorkload, micro: np.ndarray, cap: np.ndarray) -> tuple:
    """(number of micro batches, mean tokens per micro batch, tokens of the largest micro batch)."""
    dyn = k["dyn"] > 0
    padded_len = w.max_prompt_length + w.max_response_length
    seq_len = np.where(k["remove_pad"] > 0, w.seq_mean, padded_len)
    micro = np.maximum(micro, 1)
    n_static = np.ceil(seqs_gpu / micro)
    mean_static = micro * seq_len
    longest = w.prompt_max + w.resp_max
    worst = np.minimum(micro * w.seq_mean + 3.0 * np.sqrt(micro) * w.resp_std, micro * longest)
    peak_static = np.where(k["remove_pad"] > 0, np.maximum(worst, longest), micro * padded_len)
    tokens_gpu = seqs_gpu * seq_len  # padded tokens are computed too without remove_padding
    n_dyn = np.ceil(tokens_gpu / (cap * PACKING_EFFICIENCY))
    mean_dyn = tokens_gpu / np.maximum(n_dyn, 1)
    peak_dyn = np.minimum(cap, np.maximum(mean_dyn * 1.08, np.where(k["remove_pad"] > 0, longest, padded_len)))
    return (np.where(dyn, n_dyn, n_static), np.where(dyn, mean_dyn, mean_static), np.where(dyn, peak_dyn, peak_static))


def offload_bw(sc: Scenario) -> float:
    """Host<->device rate of verl's offload copies per GPU, all GPUs copying at once (bytes/s)."""
    return sc.gpu.pcie_bw * PAGEABLE_SHARE * sc.consts.offload_bw


def _collective_bw(sc: Scenario) -> float:
    return (sc.gpu.nvlink_bw if sc.nnodes == 1 else sc.gpu.ib_bw) * sc.consts.collective_bw


def mfu_cap(sc: Scenario) -> float:
    """MFU of very large micro batches: the GPU's training efficiency x the model-size factor."""
    return min(0.92, sc.gpu.train_eff * sc.model.size_factor * sc.consts.train_mfu)


def mfu_half_tokens(sc: Scenario) -> float:
    """Tokens per micro batch at half the MFU cap: more for small models and for FLOP-rich GPUs."""
    return 1500.0 * (8.19e9 / sc.model.params) ** 0.53 * (sc.gpu.bf16_flops / 989e12) * sc.consts.mfu_half_tokens


def _mfu(sc: Scenario, tokens_per_micro: np.ndarray) -> np.ndarray:
    half = mfu_half_tokens(sc)
    return mfu_cap(sc) * tokens_per_micro / (tokens_per_micro + half)


def layer_activation_bytes(sc: Scenario) -> float:
    """Saved activations per token and decoder layer in bf16 (flash attention, SwiGLU, no dropout).

    Attention: the QKV input, Q, K, V and the attention output (~8 x hidden); two RMSNorm inputs (4 x
    hidden); the MLP: its input (2 x hidden) and gate, up, SiLU(gate) and their product (8 x FFN) - the
    tensors autograd keeps (Korthikanti et al. 2022's accounting, for a gated MLP and flash attention).
    """
    m = sc.model
    return (14 * m.hidden + 8 * m.intermediate) * sc.consts.act_bytes


def train_phases(sc: Scenario, k: dict, w: StepWorkload) -> dict[str, np.ndarray]:
    """old_log_prob, ref and update_actor: time and peak memory of each."""
    m, g = sc.model, sc.gpu
    n_gpus = sc.n_gpus
    sp = np.maximum(k["sp"], 1)
    dp = n_gpus / sp
    seqs_gpu = w.seqs / dp  # sequences each data-parallel rank holds (SP ranks split their tokens)
    flops_tok = 2 * m.active_params + 2 * m.layers * m.hidden * w.seq_mean  # forward, attention included
    frag = np.where(k["fsdp2"] > 0, 1.0, FSDP_FRAGMENTATION)
    bw = _collective_bw(sc)
    ag_bytes = m.weight_bytes * (n_gpus - 1) / n_gpus  # bf16 all-gather of the sharded params
    rs_bytes = 2 * ag_bytes  # fp32 gradient reduce-scatter
    sp_cost = 1 + 0.06 * (sp - 1)  # Ulysses all-to-all
    fsdp2_speed = np.where(k["fsdp2"] > 0, 0.96, 1.0)
    pcie = g.pcie_bw
    host = offload_bw(sc)

    state_params = 4 * m.params / n_gpus / GIB  # fp32 shard
    state_optim = 8 * m.params / n_gpus / GIB
    state_grads = 4 * m.params / n_gpus / GIB
    ref_params = 2 * m.params / n_gpus / GIB
    gathered = (2 * 2 * m.params / m.layers + m.vocab * m.hidden * 2) / GIB  # two layers + lm head in bf16
    kv_kept = (1 - k["free_cache"]) * k["util"] * g.memory_gb  # vLLM keeps its pool when not freed
    resident_optim = (1 - k["opt_off"]) * state_optim
    # torch's accounting of this architecture (memory_truth.json), or None: the textbook count below
    truth = torch_memory.truth_for(sc)

    # forward-only log-prob passes (old policy; the ref policy when a KL term is on)
    def forward_pass(micro: np.ndarray, cap: np.ndarray, offloaded: np.ndarray, params_gb: float) -> tuple:
        n_mb, mean_tok, peak_tok = _micro_batches(k, seqs_gpu, w, micro, cap)
        tokens = n_mb * mean_tok / sp
        compute = tokens * flops_tok / (g.bf16_flops * _mfu(sc, mean_tok / sp))
        comm = n_mb * ag_bytes / bw
        overhead = n_mb * m.layers * T_MICRO_PER_LAYER_FWD_S
        t = (np.maximum(compute, comm) + overhead) * sp_cost * fsdp2_speed
        t = t * (1 + 0.01 * k["ent_chunk"])  # python loop over logit chunks
        t = t + offloaded * (2 * params_gb * GIB / host + OFFLOAD_SYNC_S)  # load before, offload after
        logits_b = np.where(k["ent_chunk"] > 0, 2.5, 6.0) * m.vocab * sc.consts.logits_bytes
        act = peak_tok / sp * (logits_b + 8 * m.hidden) / GIB * frag
        if truth is not None:
            # torch's accounting: the fp32 shard, the gathered units and the pass's activations and logits
            static, dyn = torch_memory.peak_gb(sc, truth, "logprob", 0.0, peak_tok / sp, frag * sc.consts.logits_bytes)
            dyn = dyn - peak_tok / sp * FUSED_LOGITS_SAVING["logprob"] * m.vocab / GIB * frag
            chunked = peak_tok / sp * 3.5 * m.vocab * k["ent_chunk"] / GIB * frag  # chunked entropy
            act = static - state_params + dyn - chunked  # (everything but the fp32 shard, counted below)
        return t, act

    t_old, act_old = forward_pass(k["lp_micro"], k["lp_tok_cap"], k["param_off"], state_params)
    mem_old = state_params + resident_optim + (1 - k["ref_off"]) * ref_params * w.uses_ref + act_old + kv_kept
    mem_old = mem_old + (gathered if truth is None else 0.0)
    if w.uses_ref:
        t_ref, act_ref = forward_pass(k["ref_micro"], k["ref_tok_cap"], k["ref_off"], ref_params)
        t_ref = t_ref * 1.0
        mem_ref = (1 - k["param_off"]) * state_params + resident_optim + ref_params + act_ref + kv_kept
        mem_ref = mem_ref + (gathered if truth is None else 0.0)
    else:
        t_ref = np.zeros_like(t_old)
        mem_ref = np.zeros_like(mem_old)

    # update: forward + backward (+ recompute under gradient checkpointing), per mini batch
    n_mini = max(1, w.seqs // (w.mini_batch * w.n)) * w.ppo_epochs
    seqs_gpu_mini = seqs_gpu / max(1, w.seqs // (w.mini_batch * w.n))
    n_mb, mean_tok, peak_tok = _micro_batches(k, seqs_gpu_mini, w, k["ppo_micro"], k["tok_cap"])
    n_mb_total = n_mb * n_mini
    tokens = n_mb_total * mean_tok / sp
    mult = np.where(k["grad_ckpt"] > 0, 4.0, 3.0)
    compute = tokens * flops_tok * mult / (g.bf16_flops * _mfu(sc, mean_tok / sp))
    comm = n_mb_total * (2 * ag_bytes + rs_bytes) / bw
    overhead = n_mb_total * m.layers * T_MICRO_PER_LAYER_FWD_S * (mult - 1 + 1)
    t_upd = (np.maximum(compute, comm) + overhead) * sp_cost * fsdp2_speed
    t_upd = t_upd * (1 + 0.02 * k["ent_ckpt"])  # entropy recomputed in backward
    # activation offload: checkpoints (or half of all activations without checkpointing) cross PCIe both
    # ways; about half of the copy hides behind compute
    off_bytes = np.where(k["grad_ckpt"] > 0, m.layers * m.hidden * 2, 0.5 * m.layers * layer_activation_bytes(sc))
    t_upd = t_upd + k["act_off"] * tokens * off_bytes * 2 / pcie * 0.5
    t_upd = t_upd + n_mini * 3 * (state_params + state_optim) * GIB / g.hbm_bw  # AdamW step, memory-bound
    # verl loads offloaded state to the GPU before the update and moves it back after (pageable copies)
    t_upd = t_upd + k["opt_off"] * (2 * state_optim * GIB / host + OFFLOAD_SYNC_S)
    t_upd = t_upd + k["param_off"] * (2 * state_params * GIB / host + OFFLOAD_SYNC_S)
    layer_act = layer_activation_bytes(sc)
    per_tok = np.where(
        k["grad_ckpt"] > 0,
        m.layers * m.hidden * 2 * np.where(k["act_off"] > 0, 0.1, 1.0) + layer_act,
        m.layers * layer_act * np.where(k["act_off"] > 0, 0.5, 1.0),
    )
    logits_b = m.vocab * (np.where(k["ent_ckpt"] > 0, 4.0, 6.0) + (2.0 if w.entropy_in_update else 0.0)) * sc.consts.logits_bytes
    act_upd = peak_tok / sp * (per_tok + logits_b) / GIB * frag
    mem_upd = state_params + state_optim + state_grads + gathered + act_upd + kv_kept
    if truth is not None:
        # torch's accounting: parameters, the gradients and Adam state present at the peak, gathered units,
        # activations, logits; the knobs it did not vary act as the textbook deltas (activation offload keeps
        # half of the saved activations, or a tenth of the checkpoints; entropy checkpointing drops 2 x vocab
        # bytes per token; an entropy bonus adds them)
        tok = peak_tok / sp
        static, dyn = torch_memory.peak_gb(sc, truth, "update", k["grad_ckpt"], tok, frag * sc.consts.act_bytes)
        dyn = dyn - tok * FUSED_LOGITS_SAVING["update"] * m.vocab / GIB * frag
        logits_t = tok * 8.0 * m.vocab / GIB
        kept = np.where(k["grad_ckpt"] > 0, 0.3, 0.5)
        dyn = dyn - k["act_off"] * (1 - kept) * np.maximum(dyn - logits_t, 0.0)
        dyn = dyn + tok * m.vocab * sc.consts.logits_bytes * (
            -2.0 * k["ent_ckpt"] + (2.0 if w.entropy_in_update else 0.0)) / GIB * frag
        mem_upd = static + dyn + kv_kept
    mem_upd = mem_upd + (1 - k["ref_off"]) * ref_params * w.uses_ref + CUDA_CONTEXT_GB
    mfu = tokens * flops_tok * 3 / (g.bf16_flops * np.maximum(t_upd, 1e-9))
    return {
        "t_old": t_old,
        "t_ref": t_ref,
        "t_update": t_upd,
        "mem_old": mem_old + CUDA_CONTEXT_GB,
        "mem_ref": np.where(w.uses_ref, mem_ref + CUDA_CONTEXT_GB, 0.0),
        "mem_update": mem_upd,
        "mfu": mfu,
        "micro_batches": n_mb_total,
    }


def step_overheads(sc: Scenario, k: dict, w: StepWorkload) -> dict[str, np.ndarray]:
    """Weight sync to vLLM, vLLM wake/sleep, reward scoring, advantage computation."""
    m, g = sc.model, sc.gpu
    n_gpus = sc.n_gpus
    tp = np.asarray(k["tp"], dtype=float)
    bw = _collective_bw(sc)
    sync = m.weight_bytes * (n_gpus - 1) / n_gpus / bw + m.weight_bytes / tp / 200e9 + 0.5
    sync = sync + k["param_off"] * (2 * 4 * m.params / n_gpus / offload_bw(sc) + OFFLOAD_SYNC_S)
    wake = k["free_cache"] * (0.8 + m.weight_bytes / tp / g.pcie_bw + 0.3 * k["util"])
    reward = 0.3 + w.seqs * 0.4e-3
    adv = 0.05 + w.seqs * 1e-5
    return {"t_weights": sync + wake, "t_reward": reward, "t_adv": adv + 0 * tp}


def simulate_step(sc: Scenario, k: dict, w: StepWorkload) -> dict[str, np.ndarray]:
    """Every phase of one step, noise-free: times, memories, peak, throughput."""
    out: dict[str, np.ndarray] = {}
    out.update(rollout_phase(sc, k, w))
    out.update(train_phases(sc, k, w))
    out.update(step_overheads(sc, k, w))
    out["t_step"] = out["t_gen"] + out["t_old"] + out["t_ref"] + out["t_update"] + out["t_weights"] + out["t_reward"] + out["t_adv"]
    out["peak_gb"] = np.maximum.reduce([out["mem_gen"], out["mem_old"], out["mem_ref"], out["mem_update"]])
    out["throughput"] = w.tokens / (out["t_step"] * sc.n_gpus)
    return out
