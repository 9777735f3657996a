"""A per-phase performance and memory model of one RL (GRPO) step, calibrated online on measured trials.

Inputs: the job's description (``mart.state.job.JobDescription``: the model's config.json, the GPU, the
cluster, the workload), a flat verl config (or thousands of them as numpy arrays), and the measured trials
(phase times ``timing_s/*``, peak memory, response lengths). Output per config: the time and peak memory of
each phase (rollout ``gen``, ``old_log_prob``, ``ref``, ``update_actor``, ``other``), the step time, the
throughput (tokens / step / GPU, verl's ``perf/throughput``) and whether vLLM's KV cache can hold one
sequence at all.

The formulas are textbook (sources in docs/agents.md, "The job model"):
- FSDP (ZeRO-3) shards: fp32 parameters 4 B, gradients 4 B, Adam moments 8 B per parameter / GPUs
  (Rajbhandari et al. 2020); bf16 weights 2 B per parameter in the rollout engine, split by TP.
- activations per token per layer after Korthikanti et al. 2022 (no dropout, flash attention: no
  s^2 term), one layer's input per layer with full recomputation (gradient checkpointing);
  logits vocab x tokens x bytes (verl's perf guide: 4+2+1 B in forward passes).
- vLLM: ``gpu_memory_utilization`` x capacity is the engine's whole budget (weights, activation
  workspace of a ``max_num_batched_tokens`` profile run, KV cache); CUDA graphs sit outside it.
- decode is HBM-bandwidth bound: each engine step reads the weight shard and the running sequences'
  KV cache; concurrency = min(max_num_seqs, sequences per engine, KV tokens / context); when the KV cache
  binds, vLLM preempts and recomputes; the step ends with the longest response (the long tail).
- training passes are FLOP bound (2 x params FLOPs per token forward, 3x with backward, 4x with
  recomputation) at an efficiency that rises with the tokens per micro batch (a saturating curve),
  overlapped with FSDP's all-gather/reduce-scatter traffic; TP adds per-layer all-reduces in decode.

Calibration (``JobModel.fit``): per-phase log time scales (kernel-weighted by similarity of configs, so
the model is exact at measured configs and falls back to the mean far from them), two structural
constants chosen by least squares once there are enough trials (decode step overhead, micro-batch
efficiency knee), and per-phase additive memory biases fitted to the measured peaks: a measured peak
bounds every phase from above and raises the bias of every phase that could have produced it.
The model never reads the simulator: the sim backend only describes its job as a user would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist
from typing import Any

import numpy as np

from mart.nodes.agents.memory_source import MemorySource, resolve
from mart.state.agents import ASYNC_TASKS_PARAM, agent_knob, agents_in_config
from mart.state.job import JobDescription, version_at_least
from mart.state.metrics import phase_seconds
from mart.state.search_space import ParamSpec
from mart.state.verl_keys import ACTOR as A
from mart.state.verl_keys import ROLLOUT as R
from mart.trial_runner.memory_probe import Coefficients
from mart.trial_runner.verl.space import SEARCH_SPACE as VERL_SPACE

GIB = 1024.0**3

#: the catalogue records the model reads (``ParamSpec.model`` names them): verl's knobs, and the concurrent workflow
#: tasks of an asynchronous multi-agent rollout (MARTI's OPENRLHF_ASYNC_NUM_TASKS; 0 = synchronous stages, each
#: ending at a barrier), absent from a single-agent job's catalogue
MODEL_SPECS: dict[str, ParamSpec] = {p.model: p for p in (*VERL_SPACE.params, ASYNC_TASKS_PARAM) if p.model}
#: model knob -> (verl key, the catalogue's default when the config does not set it)
KNOBS: dict[str, tuple[str, Any]] = {name: (p.key, p.default) for name, p in MODEL_SPECS.items()}
#: the numeric knobs (by their records' kinds): calibration compares configs in doublings of these, in equality of
#: the switches and named choices
NUMERIC_KNOBS = frozenset(name for name, p in MODEL_SPECS.items() if p.kind in ("int", "float", "log") or (
    p.kind == "categorical" and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in p.choices or ())))
#: knobs that only the rollout phase reads / only the training passes read; the rest are shared
ROLLOUT_KNOBS = ("util", "tp", "mns", "mnbt", "chunked", "prefix", "eager", "async")
TRAIN_KNOBS = ("lp_micro", "ref_micro", "ppo_micro", "dyn", "tok_cap", "sp", "fsdp2", "ckpt", "act_off",
               "remove_pad", "ent_chunk", "ent_ckpt")
SHARED_KNOBS = ("param_off", "opt_off", "ref_off", "free_cache")
PHASES = ("gen", "old_log_prob", "ref", "update_actor", "other")
#: the knobs each phase's time depends on (the calibration's similarity is measured over these alone)
PHASE_TIME_KNOBS: dict[str, tuple[str, ...]] = {
    "gen": ROLLOUT_KNOBS,
    "old_log_prob": ("lp_micro", "dyn", "tok_cap", "sp", "fsdp2", "remove_pad", "ent_chunk", "param_off"),
    "ref": ("ref_micro", "dyn", "tok_cap", "sp", "fsdp2", "remove_pad", "ent_chunk", "ref_off"),
    "update_actor": ("ppo_micro", "dyn", "tok_cap", "sp", "fsdp2", "ckpt", "act_off", "remove_pad", "ent_chunk",
                     "ent_ckpt", "param_off", "opt_off"),
    "other": ("tp", "util", "free_cache", "param_off"),
}
MICRO_KNOBS = ("lp_micro", "ref_micro", "ppo_micro")
#: sharpness of the similarity kernel: a trial one unit away (a switch flipped, TP doubled, a size x4) weighs 5%
#: of one at the same point, so a measured shape's residual is what predicts that shape (with 1.2, several
#: trials one unit away outweighed the one trial that ran it, and a mispriced shape stayed mispriced after it ran)
KERNEL = 3.0
#: pull of the GEMM knee and the collective bandwidth towards their priors when one or two trials fit them
#: (x the squared log multipliers, against the squared log residuals of the training passes and the sync)
SHAPE_PRIOR = 0.05
MEM_PHASES = ("gen", "old_log_prob", "ref", "update_actor")
#: verl timing keys of the phases lumped into "other" (weight sync, reward, advantages)
OTHER_TIMINGS = ("update_weights", "reward", "adv")

# Generic priors (public orders of magnitude, refined by calibration): achieved fraction of HBM bandwidth in
# decode and of peak FLOPs in large GEMMs, vLLM engine-step CPU cost, per-layer kernel launch without CUDA
# graphs, NCCL latency, per micro batch Python/hook cost per layer, CUDA context, vLLM's largest captured
# CUDA-graph batch (vLLM's default max capture size is 512).
HBM_EFF, GEMM_EFF, DECODE_EFF = 0.8, 0.5, 0.4
STEP_OVERHEAD_S = 5e-3
#: vLLM's CPU work per running sequence and engine step (scheduling, sampling, detokenising: the overhead vLLM's
#: v0.6.0 and V1 announcements describe): what makes one engine holding many sequences slower per token than
#: several holding few (without it the model priced TP 8 on a 16k-response job 16% faster; it ran 5% slower)
SEQ_OVERHEAD_S = 10e-6
LAUNCH_PER_LAYER_S = 40e-6
NCCL_LAT_S = 10e-6
MICRO_OVERHEAD_PER_LAYER_S = 0.2e-3
CUDA_CONTEXT_GB = 0.5
VLLM_NON_TORCH_GB = 0.5
GRAPH_MAX_BATCH = 512
DEFAULT_FLOPS, DEFAULT_HBM = 400e12, 2.0e12
#: DEFAULT_HOST: pinned host<->device bytes/s per device over a PCIe Gen5 x16 link while every device of the node
#: copies at once (an older generation: half per step down)
DEFAULT_INTRA, DEFAULT_INTER, DEFAULT_HOST = 150e9, 20e9, 12e9
#: verl's FSDP offloads (``offload_fsdp_model_to_cpu``, ``offload_fsdp_optimizer`` in verl/utils/fsdp_utils.py) copy
#: with ``.to("cpu")`` into pageable memory, which the driver stages through a pinned buffer: a fraction of the
#: pinned rate (NVIDIA's "How to Optimize Data Transfers in CUDA C/C++"), every device of the node copying at once.
#: Each load or offload also synchronises and empties the allocator's cache. (With the pinned rate and no sync the
#: model priced the 7B A100-40GB job's parameter offload at +1.2 s a step where the simulator's costs +16 s, and
#: proposed it as a free enabler.)
PAGEABLE_SHARE = 0.3
OFFLOAD_SYNC_S = 0.3
ASYNC_TAIL_SHARE = 0.5  # share of the long tail async tasks recover (prior; calibration corrects the scale)
#: bytes x vocab per token that verl's log-prob path with flash-attn's fused cross-entropy (what verl's images run:
#: ``logprobs_from_logits`` with ``inplace_backward``) keeps below the non-fused fp32 one the memory probe measures
#: (bf16 logits, an fp32 copy and its fp32 log-softmax; the backward's fp32 gradients): the forward keeps the bf16
#: logits and the entropy's bf16 softmax (10 -> 6), the update the bf16 logits and their gradient (12 -> 4)
FUSED_LOGITS_SAVING = {"logprob": 4.0, "update": 8.0}
UNTESTED_SAVING_SHARE = 0.5  # of the memory an approximate saver (activation offload, entropy tricks) claims
DYN_IMBALANCE = 1.1  # the largest of verl's length-balanced dynamic micro batches vs their mean
KV_HEADROOM = 1.5  # KV cache for 1.5x the running sequences: response lengths grow, and the context is an estimate
CPU_FLOPS = 2e10  # an emulated device on one CPU core: tens of GFLOP/s; calibration sets the real scale


def _num(v: Any, default: Any) -> float:
    if v is None:
        v = default
    if isinstance(v, str):
        low = v.lower()
        if low in ("true", "yes"):
            return 1.0
        if low in ("false", "no"):
            return 0.0
        if low == "fsdp2":
            return 1.0
        if low == "fsdp":
            return 0.0
        try:
            return float(v)
        except ValueError:
            return 0.0
    if v is None:
        return 0.0
    return float(v)


def _lookup(config: dict[str, Any], key: str, agents: list[int] | None = None) -> Any:
    """A knob's value: the first agent's ``agents.<i>.<key>`` in a multi-agent job whose agents carry their
    own copy of a system knob (the search moves all agents' copies together; a copy overrides the shared
    value), else the key itself."""
    for agent in agents_in_config(config) if agents is None else agents:
        own = agent_knob(agent, key)
        if own in config:
            return config[own]
    return config.get(key)


@dataclass
class Workload:
    """What one step processes: taken from the measured trials (response lengths) and the config."""

    seqs: float
    n: float
    prompt_mean: float
    resp_mean: float
    resp_max: float
    max_len: float
    uses_ref: float
    mini_prompts: float
    epochs: float
    resp_cv2: float | None = None
    """squared coefficient of variation of the response lengths, fitted to the measured ones
    (``response_length_fit``); None = nothing measured, the spread is then read from ``resp_sd``"""

    @property
    def seq_mean(self) -> float:
        return self.prompt_mean + self.resp_mean

    @property
    def tokens(self) -> float:
        return self.seqs * self.seq_mean

    @property
    def resp_sd(self) -> float:
        # a memory tail bound: the longest of many draws taken as ~3 standard deviations above the mean (more
        # than a right-skewed length's real spread, on the safe side for a micro batch's largest token count)
        return max(1.0, (self.resp_max - self.resp_mean) / 3.0)


@dataclass
class Calibration:
    """Fitted constants. ``time_obs`` holds (knob vector, {phase: log(measured / raw predicted)})."""

    step_overhead_mult: float = 1.0
    knee_mult: float = 1.0
    comm_mult: float = 1.0
    """x the described collective bandwidths (TP all-reduces, FSDP gathers): a link's reached bandwidth is a guess"""
    act_scale: tuple[float, float] = (1.0, 1.0)
    """(saved activations, logits) x the textbook bytes; the textbook terms until peaks are measured (the
    distance-grown gap carries their uncertainty: a prior above 1 on top of it counted the error twice, and
    no large token cap fitted without optimizer offload)"""
    mem_bias: dict[str, float] = field(default_factory=dict)
    time_obs: list[tuple[dict[str, float], dict[str, float]]] = field(default_factory=list)
    peak_errors: list[float] = field(default_factory=list)
    throughput_errors: list[float] = field(default_factory=list)


@dataclass
class Observation:
    """One measured trial as the model needs it."""

    config: dict[str, Any]
    phases: dict[str, float]  # phase -> mean seconds over the measured updates
    peak_gb: float | None
    oom: bool = False
    throughput: float | None = None
    resp_mean: float | None = None
    resp_max: float | None = None
    prompt_mean: float | None = None
    clip_ratio: float | None = None  # share of responses cut at the trial's max_response_length
    predicted_peak_gb: float | None = None  # what was predicted before it ran (accuracy record)
    predicted_throughput: float | None = None
    phase_peaks: dict[str, float] | None = None
    """each phase's own peak where something measured it (a fit probe); ``peak_gb`` is only their maximum"""


@dataclass
class Prediction:
    throughput: float
    step_s: float
    phase_s: dict[str, float]
    phase_gb: dict[str, float]
    peak_gb: float
    kv_fail: bool
    confidence: float
    gap_gb: float

    def to_dict(self) -> dict[str, Any]:
        return {"throughput": round(self.throughput, 2), "step_s": round(self.step_s, 3),
                "peak_gb": round(self.peak_gb, 2), "phase_s": {k: round(v, 3) for k, v in self.phase_s.items()},
                "phase_gb": {k: round(v, 2) for k, v in self.phase_gb.items()}, "kv_cache_fits": not self.kv_fail,
                "confidence": round(self.confidence, 2), "safety_gap_gb": round(self.gap_gb, 2)}


class JobModel:
    """Per-phase time and memory of a GRPO step on one job (see the module docstring)."""

    def __init__(self, job: JobDescription, base_config: dict[str, Any] | None = None,
                 calibration: Calibration | None = None, memory: MemorySource | None = None) -> None:
        self.job = job
        #: torch's accounting of the architecture (the probe), or the textbook count where it cannot run
        self.memory = memory if memory is not None else resolve(job)
        self.base_config = dict(base_config or {})
        self.cal = calibration or Calibration()
        m, hw = job.model, job.hardware
        self.P = m.n_params
        self.L, self.h, self.f, self.V = m.num_hidden_layers, m.hidden_size, m.ffn, m.vocab_size
        self.kv_bytes = 2 * self.L * m.kv_heads * m.dhead * 2  # K and V, every layer, bf16
        self.kv_heads = m.kv_heads
        self.P_active = m.active_params  # what a token's FLOPs pass through (an MoE routes to a few experts)
        # vLLM >= 0.21 counts its CUDA graphs inside gpu_memory_utilization (they take KV cache), before on top
        self.graphs_inside = version_at_least(job.vllm_version, (0, 21))
        self.kv_dim = m.kv_heads * m.dhead
        self.gated = m.gated_mlp
        self.C = hw.memory_gb
        self.N = job.n_gpus
        self.copies = job.resident_policies  # policy copies on each device (a colocated multi-agent team)
        self.cpu = hw.cpu or job.engine != "vllm"
        self.flops = hw.bf16_flops or (CPU_FLOPS if hw.cpu else DEFAULT_FLOPS)
        self.hbm = (hw.hbm_bandwidth or (CPU_FLOPS / 4 if hw.cpu else DEFAULT_HBM)) * HBM_EFF
        intra = hw.intra_node_bandwidth or DEFAULT_INTRA
        self.intra_bw = intra  # TP all-reduces stay within a node (an engine never spans nodes)
        self.coll_bw = intra if job.nnodes == 1 else (hw.inter_node_bandwidth or DEFAULT_INTER)
        # pinned copies (vLLM's sleep mode, activation offload); the default is a Gen5 link's, halved per generation
        self.host_bw = hw.host_bandwidth or DEFAULT_HOST * 2.0 ** min(0, (hw.pcie_gen or 5) - 5)
        # FSDP's parameter and optimizer offloads (pageable); an emulated CPU device has nothing to copy over a link
        self.offload_bw = self.host_bw if hw.cpu else self.host_bw * PAGEABLE_SHARE
        self.offload_sync_s = 0.0 if hw.cpu else OFFLOAD_SYNC_S
        self.workload_obs: Observation | None = None
        self.ctx_gb = 0.0 if hw.cpu else CUDA_CONTEXT_GB
        self._mem_refs: list[dict[str, float]] = []
        self._measured_on: set[str] = set()  # memory savers on in some measured config

    def _offload_s(self, shard_bytes: float) -> float:
        """Seconds to load an FSDP-offloaded shard of ``shard_bytes`` per device and offload it again."""
        return 2 * shard_bytes / self.offload_bw + self.offload_sync_s

    # -- configs -> knob arrays -------------------------------------------------------------------
    def knobs(self, config: dict[str, Any]) -> dict[str, float]:
        full = {**self.base_config, **config}
        agents = agents_in_config(full)
        out = {name: _num(_lookup(full, key, agents), default) for name, (key, default) in KNOBS.items()}
        if self.cpu:
            out.update(util=0.0, tp=1.0, eager=1.0, prefix=0.0, chunked=1.0)
        return out

    def workload(self, config: dict[str, Any]) -> Workload:
        full = {**self.base_config, **config}
        agents = agents_in_config(full)
        wl = self.job.workload
        batch = _num(_lookup(full, "data.train_batch_size", agents), wl.train_batch_size)
        n = _num(_lookup(full, R + "n", agents), wl.rollout_n)
        max_p = _num(_lookup(full, "data.max_prompt_length", agents), wl.max_prompt_length)
        max_r = _num(_lookup(full, "data.max_response_length", agents), wl.max_response_length)
        obs = self.workload_obs
        prompt = (obs.prompt_mean if obs and obs.prompt_mean else None) or wl.prompt_length_mean or max_p / 2
        resp = (obs.resp_mean if obs and obs.resp_mean else None) or wl.response_length_mean or max_r / 2
        resp_max = (obs.resp_max if obs and obs.resp_max else None) or max_r
        cut_at = _cut_limit(obs)
        if obs is not None and cut_at is not None and max_r > cut_at:
            # the measured responses were cut at a shorter limit: under this one the tail runs on to it (the step
            # ends with its longest response), and the cut ones grow by about half the added room
            resp_max = max_r
            resp = resp + (obs.clip_ratio or 0.0) * (max_r - cut_at) / 2
        resp, resp_max = min(resp, max_r), min(max(resp_max, resp), max_r)
        cv2 = None
        if obs is not None and obs.resp_mean and obs.resp_max:
            # fitted under the limit and the responses per step the observed trial ran with
            ran = {**self.base_config, **obs.config}
            fitted = response_length_fit(
                obs.resp_mean, obs.resp_max, obs.clip_ratio,
                _num(_lookup(ran, "data.max_response_length", agents), max_r),
                _num(_lookup(ran, "data.train_batch_size", agents), batch) * _num(_lookup(ran, R + "n", agents), n))
            if fitted is not None:
                e1, e2 = truncated_lognormal_moments(*fitted, max_r)
                cv2 = max(e2 / max(e1 * e1, 1e-9) - 1.0, 0.0)
        uses_ref = bool(_num(_lookup(full, A + "use_kl_loss", agents), wl.uses_reference)) or bool(
            _num(_lookup(full, "algorithm.use_kl_in_reward", agents), False))
        mini = _num(_lookup(full, A + "ppo_mini_batch_size", agents), batch)
        epochs = _num(_lookup(full, A + "ppo_epochs", agents), 1)
        return Workload(seqs=batch * n, n=n, prompt_mean=prompt, resp_mean=resp, resp_max=resp_max,
                        max_len=max_p + max_r, uses_ref=float(uses_ref), mini_prompts=min(mini, batch), epochs=epochs,
                        resp_cv2=cv2)

    # -- the raw (uncalibrated in scale) model, vectorised over knob arrays -------------------------
    def raw(self, k: dict[str, Any], w: Workload) -> dict[str, np.ndarray]:
        k = {name: np.asarray(v, dtype=float) for name, v in k.items()}
        out: dict[str, np.ndarray] = {}
        out.update(self._rollout(k, w))
        out.update(self._training(k, w))
        out.update(self._other(k, w))
        return out

    def _resident_gb(self, k: dict, w: Workload) -> dict[str, np.ndarray]:
        """Per-GPU FSDP shards (ZeRO-3): fp32 params 4 B, grads 4 B, Adam moments 8 B; ref bf16 2 B."""
        shard = self.P / self.N / GIB
        res = {"params": 4 * shard * (1 - k["param_off"]), "params_all": 4 * shard + 0 * k["param_off"],
               "grads": 4 * shard, "optim": 8 * shard * (1 - k["opt_off"]), "optim_all": 8 * shard + 0 * k["opt_off"],
               "ref": 2 * shard * (1 - k["ref_off"]) * w.uses_ref}
        if self.copies > 1:
            # the other agents of a team on this device: their static memory sits there in every phase
            # (gradients kept between steps, the reference in fp32 on a CPU); activations, logits and KV
            # cache peak for one agent at a time, since the agents run their phases one after another
            ref_bytes = 4.0 if self.cpu else 2.0
            others = (self.copies - 1) * shard * (4 * (1 - k["param_off"]) + 4 + 8 * (1 - k["opt_off"])
                                                  + ref_bytes * (1 - k["ref_off"]) * w.uses_ref)
            res["params"] = res["params"] + others
            res["params_all"] = res["params_all"] + others
        return res

    def _rollout(self, k: dict, w: Workload) -> dict[str, np.ndarray]:
        res = self._resident_gb(k, w)
        cal = self.cal
        W = 2 * self.P  # bf16 weights
        resident = res["params"] + res["optim"] + res["ref"]
        if self.cpu:
            # plain batched generation (the local workload): max_num_seqs sequences per decode loop, one KV
            # cache per sequence; the loop count is what costs on a small model
            seqs = w.seqs
            c = np.minimum(np.maximum(k["mns"], 1), seqs)
            loops = np.ceil(seqs / c)
            iters = loops * w.resp_max
            t_tok = 2 * self.P / (self.flops * GEMM_EFF)
            t_gen = iters * STEP_OVERHEAD_S * cal.step_overhead_mult * 0.2 + seqs * w.resp_mean * t_tok
            kv = c * w.max_len * self.kv_bytes / GIB
            mem = resident + kv + c * self.V * 4 * w.resp_max / GIB + self.ctx_gb * 0
            return {"t_gen": t_gen, "m_gen": mem, "kv_fail": np.zeros_like(t_gen, dtype=bool),
                    "concurrency": c, "kv_pool_gb": kv, "u_gen": mem - resident}
        tp = np.maximum(k["tp"], 1)
        engines = self.N / tp
        per_engine = w.seqs / engines
        budget = k["util"] * self.C
        graphs = (1 - k["eager"]) * (0.2 + 0.8 * math.sqrt(self.h / 4096) * np.minimum(k["mns"], GRAPH_MAX_BATCH) / 256)
        kv_pool = budget - self._vllm_fixed_gb(k) - (graphs if self.graphs_inside else 0.0)
        kv_tokens = np.maximum(kv_pool, 0) * GIB / self._kv_rank_bytes(tp)
        kv_fail = kv_tokens < w.max_len
        ctx = self._decode_context(w)
        want = self._wanted_concurrency(k, w)
        c_kv = np.maximum(kv_tokens / ctx, 1)
        c = np.minimum(want, c_kv)
        # async workflow tasks: an engine batches only the sequences of the tasks in flight (n samples each)
        tasks = k["async"]
        in_flight = np.maximum(tasks * w.n / engines, 1.0)
        c_sync = c
        c = np.where(tasks > 0, np.minimum(c, in_flight), c)
        preempt = np.clip(1 - c_kv / want, 0, 1)
        mem = budget + resident + (0.0 if self.graphs_inside else graphs) + self.ctx_gb
        # prefill: FLOP bound; prefix caching shares a prompt's prefill across its n samples
        prefill_tok = per_engine * w.prompt_mean / np.where(k["prefix"] > 0, w.n, 1)
        t_prefill = prefill_tok * 2 * self.P_active / tp / (self.flops * GEMM_EFF) * np.where(k["chunked"] > 0, 1.0, 1.1)
        # decode: engine steps x (fixed + weight read) + tokens x (KV read), compute once the batch is large
        eager_like = np.maximum(k["eager"], (c > GRAPH_MAX_BATCH).astype(float))
        fixed = STEP_OVERHEAD_S * cal.step_overhead_mult + eager_like * self.L * LAUNCH_PER_LAYER_S
        fixed = fixed + (tp > 1) * self.L * 2 * NCCL_LAT_S
        # every engine step reads the weight shard once; every generated token reads its own context's KV
        # cache (and all-reduces its activations under TP); GEMMs become compute bound at large batches
        weights_s = W / tp / self.hbm
        kv_tok = ctx * self._kv_rank_bytes(tp) / self.hbm
        comm_tok = (tp > 1) * self.L * 2 * self.h * 2 * 2 * (tp - 1) / tp / (self.intra_bw * cal.comm_mult)
        compute_tok = 2 * self.P_active / tp / (self.flops * DECODE_EFF)
        # steps: the queue drains at concurrency c, then the longest response finishes alone (long tail)
        iters = np.maximum(per_engine * w.resp_mean / c + (w.resp_max - w.resp_mean), w.resp_max)
        tokens = per_engine * w.resp_mean
        t_decode = iters * fixed + np.maximum(iters * weights_s, tokens * compute_tok)
        # async tasks fill the engine steps the long tail leaves idle at each synchronous barrier (more so the
        # more sequences are in flight per engine); the prior recovers half the tail, trials calibrate it
        body = np.maximum(per_engine * w.resp_mean / c, w.resp_mean)
        tail_s = np.maximum(iters - body, 0) * (fixed + weights_s)
        overlap = np.where(tasks > 0, in_flight / (in_flight + c_sync), 0.0)
        t_decode = t_decode - np.minimum(ASYNC_TAIL_SHARE * tail_s * overlap, 0.5 * t_decode)
        # preempted sequences are recomputed: extra token work while the KV cache binds
        t_decode = t_decode + tokens * (kv_tok + comm_tok) * (1 + 0.7 * preempt)
        t_decode = t_decode + tokens * SEQ_OVERHEAD_S * cal.step_overhead_mult
        straggler = 1 + 0.02 * np.log2(np.maximum(engines, 1))
        t_gen = (t_prefill + t_decode) * straggler
        return {"t_gen": t_gen, "m_gen": mem, "kv_fail": kv_fail, "concurrency": c, "kv_pool_gb": kv_pool,
                "u_gen": graphs}

    def _kv_rank_bytes(self, tp: np.ndarray) -> np.ndarray:
        """KV bytes per token on one TP rank: vLLM gives each rank max(1, kv_heads // TP) heads."""
        heads = np.maximum(1, self.kv_heads // np.maximum(np.asarray(tp, dtype=int), 1))
        return self.kv_bytes * heads / self.kv_heads

    def _vllm_fixed_gb(self, k: dict) -> np.ndarray:
        """vLLM's budget outside the KV cache per GPU: the weight shard, the activations of its
        ``max_num_batched_tokens`` profile run plus the sampler's logits, non-torch memory."""
        tp = np.maximum(k["tp"], 1)
        workspace = (k["mnbt"] * (4 * self.h + 2 * self.f) * 2 / tp + np.minimum(k["mns"], k["mnbt"]) * self.V * 4) / GIB
        return 2 * self.P / tp / GIB + workspace + VLLM_NON_TORCH_GB

    @staticmethod
    def _decode_context(w: Workload) -> float:
        """Mean context a generated token attends to: the prompt + half the response, length-biased (a token of a
        response of length L sits at L/2 on average, and long responses hold more tokens: E[L^2] / 2 E[L] =
        mean x (1 + cv^2) / 2). The spread is the one fitted to the measured lengths where there are some: the
        longest response read as 3 standard deviations overstated a right-skewed spread (or any whose longest
        was cut at the limit) by half, and priced the KV cache binding at a concurrency it held."""
        cv2 = w.resp_cv2 if w.resp_cv2 is not None else (w.resp_sd / max(w.resp_mean, 1)) ** 2
        return w.prompt_mean + 0.5 * w.resp_mean * (1 + cv2)

    def _wanted_concurrency(self, k: dict, w: Workload) -> np.ndarray:
        per_engine = w.seqs / (self.N / np.maximum(k["tp"], 1))
        return np.maximum(np.minimum(np.minimum(k["mns"], per_engine), k["mnbt"]), 1)

    def kv_share_needed(self, k: dict[str, Any], w: Workload, headroom: float = KV_HEADROOM) -> np.ndarray:
        """The smallest ``gpu_memory_utilization`` whose KV cache holds ``headroom`` x the sequences the engine
        runs at once (and one max-length sequence): a larger share buys no concurrency (vLLM only fills the pool
        with the sequences it schedules), it only raises the rollout's peak."""
        k = {name: np.asarray(v, dtype=float) for name, v in k.items()}
        tp = np.maximum(k["tp"], 1)
        tokens = np.maximum(headroom * self._wanted_concurrency(k, w) * self._decode_context(w), w.max_len)
        graphs = (1 - k["eager"]) * (0.2 + 0.8 * math.sqrt(self.h / 4096) * np.minimum(k["mns"], GRAPH_MAX_BATCH) / 256)
        inside = graphs if self.graphs_inside else 0.0
        return (tokens * self._kv_rank_bytes(tp) / GIB + self._vllm_fixed_gb(k) + inside) / self.C

    def _micro(self, k: dict, w: Workload, seqs_gpu: float, micro: np.ndarray, cap: np.ndarray) -> tuple:
        """(micro batches, mean tokens per micro batch, tokens of the largest one)."""
        dyn = k["dyn"] > 0
        seq_len = np.where(k["remove_pad"] > 0, w.seq_mean, w.max_len)
        micro = np.maximum(micro, 1)
        n_static = np.ceil(seqs_gpu / micro)
        longest = w.prompt_mean + w.resp_max
        peak_static = np.where(k["remove_pad"] > 0,
                               np.maximum(np.minimum(micro * w.seq_mean + 2.5 * np.sqrt(micro) * w.resp_sd,
                                                     micro * longest), longest), micro * w.max_len)
        tokens_gpu = seqs_gpu * seq_len
        # verl's rearrange_micro_batches (verl/utils/seqlen_balancing.py) splits the tokens into
        # ceil(total / cap) micro batches balanced by length (Karmarkar-Karp): the largest holds about the mean,
        # not the cap (a cap above the total tokens buys nothing more)
        n_dyn = np.maximum(np.ceil(tokens_gpu / np.maximum(cap, 1)), 1)
        mean_dyn = tokens_gpu / n_dyn
        peak_dyn = np.minimum(np.maximum(cap, longest), np.maximum(mean_dyn * DYN_IMBALANCE, longest))
        return (np.where(dyn, n_dyn, n_static), np.where(dyn, mean_dyn, micro * seq_len),
                np.where(dyn, peak_dyn, peak_static))

    def _efficiency(self, tokens: np.ndarray) -> np.ndarray:
        """GEMM efficiency rising with tokens per micro batch: small batches cannot fill the device."""
        # tokens at which a GPU reaches half its GEMM efficiency (smaller models need more); a CPU core
        # saturates with tiny matrices
        knee = (64.0 if self.cpu else 2.5e6 / self.h) * self.cal.knee_mult
        return GEMM_EFF * tokens / (tokens + knee)

    def _act_per_token(self, k: dict) -> np.ndarray:
        """Bytes of saved activations per token for the whole model (Korthikanti et al. 2022, no dropout,
        flash attention; SwiGLU MLP keeps gate, up and product)."""
        h, f = self.h, self.f
        # Korthikanti et al. 2022, eq. 1 without dropout masks and with flash attention (no s^2 terms):
        # attention 10sbh (QKV input, Q, K, V, projection input; K/V shrink with GQA), MLP 2sbh + 2 x 2sbf
        # for a GELU MLP (input, fc1 out, activation out) and 2sbh + 4 x 2sbf for SwiGLU (gate, up, act,
        # product), two layer norms 4sbh
        attn = 8 * h + 4 * self.kv_dim
        mlp = 2 * h + (8 * f if self.gated else 4 * f)
        layer = attn + mlp + 4 * h
        full = self.L * layer
        ckpt = self.L * 2 * h + layer  # one input per layer + one layer being recomputed
        off = np.where(k["act_off"] > 0, 0.25, 1.0)
        return np.where(k["ckpt"] > 0, ckpt * off, full * off)

    def _training(self, k: dict, w: Workload) -> dict[str, np.ndarray]:
        res = self._resident_gb(k, w)
        sp = np.maximum(k["sp"], 1)
        dp = self.N / sp
        seqs_gpu = w.seqs / dp
        W = 2 * self.P
        flops_tok = 2 * self.P_active + 4 * self.L * self.h * w.seq_mean / 2  # matmuls + causal attention
        ag = W * (self.N - 1) / self.N / (self.coll_bw * self.cal.comm_mult) if self.N > 1 else 0.0
        frag = np.where(k["fsdp2"] > 0, 0.93, 1.0)  # FSDP2: -7% memory (verl's FSDP2 notes)
        speed = np.where(k["fsdp2"] > 0, 0.985, 1.0)
        sp_cost = 1 + 0.05 * (sp - 1)  # Ulysses all-to-all
        # FSDP gathers two layers + the lm head in bf16 at a time (nothing to gather on one device)
        gathered = (2 * 2 * self.P / self.L + self.V * self.h * 2) / GIB if self.N > 1 else 0.0
        kept_kv = (1 - k["free_cache"]) * k["util"] * self.C
        overhead = self.L * MICRO_OVERHEAD_PER_LAYER_S * (0.05 if self.cpu else 1.0)

        def forward(micro: np.ndarray, offloaded: np.ndarray, params_gb: float) -> tuple:
            n_mb, mean_tok, peak_tok = self._micro(k, w, seqs_gpu, micro, k["tok_cap"])
            tokens = n_mb * mean_tok / sp
            compute = tokens * flops_tok / (self.flops * self._efficiency(mean_tok / sp))
            t = (np.maximum(compute, n_mb * ag) + n_mb * overhead) * sp_cost * speed
            t = t + offloaded * self._offload_s(params_gb * GIB)
            logits = np.where(k["ent_chunk"] > 0, 3.0, 7.0) * self.V  # fp32 + bf16 logits, log-softmax
            act = peak_tok / sp * (logits + 6 * self.h) / GIB * frag
            chunk_saves = peak_tok / sp * 4.0 * self.V * k["ent_chunk"] / GIB * frag
            return t, act, peak_tok / sp * logits / GIB * frag, chunk_saves

        t_old, act_old, lg_old, sv_old = forward(k["lp_micro"], k["param_off"], float(4 * self.P / self.N / GIB))
        base_mem = res["optim"] + res["ref"] + gathered + kept_kv + self.ctx_gb
        m_old = res["params_all"] + base_mem + act_old  # verl reloads offloaded parameters for the log-prob pass
        if w.uses_ref:
            t_ref, act_ref, lg_ref, sv_ref = forward(k["ref_micro"], k["ref_off"], float(2 * self.P / self.N / GIB))
            m_ref = res["params"] + res["optim"] + 2 * self.P / self.N / GIB + gathered + kept_kv + self.ctx_gb + act_ref
        else:
            t_ref, m_ref, act_ref, lg_ref, sv_ref = (np.zeros_like(t_old), np.zeros_like(m_old), np.zeros_like(m_old),
                                                     np.zeros_like(m_old), np.zeros_like(m_old))
        # update: per mini batch, forward + backward (+ recompute), gradient all-gather + reduce-scatter
        n_mini = max(1.0, w.seqs / max(w.mini_prompts * w.n, 1))
        n_mb, mean_tok, peak_tok = self._micro(k, w, seqs_gpu / n_mini, k["ppo_micro"], k["tok_cap"])
        n_mb_total = n_mb * n_mini * w.epochs
        tokens = n_mb_total * mean_tok / sp
        mult = np.where(k["ckpt"] > 0, 4.0, 3.0)
        compute = tokens * flops_tok * mult / (self.flops * self._efficiency(mean_tok / sp))
        comm = n_mb_total * 4 * ag
        t_upd = (np.maximum(compute, comm) + n_mb_total * overhead * mult) * sp_cost * speed
        t_upd = t_upd + n_mini * w.epochs * 3 * 16 * self.P / self.N / self.hbm  # AdamW step, memory bound
        t_upd = t_upd + k["opt_off"] * self._offload_s(8 * self.P / self.N) + k["param_off"] * self._offload_s(4 * self.P / self.N)
        t_upd = t_upd + k["act_off"] * tokens * self._act_per_token(k) * 4 / self.host_bw * 0.5
        t_upd = t_upd * (1 + 0.02 * k["ent_ckpt"])
        logits = self.V * np.where(k["ent_ckpt"] > 0, 6.0, 8.0) - self.V * k["ent_chunk"]
        act_upd = peak_tok / sp * (self._act_per_token(k) + logits) / GIB * frag
        lg_upd = peak_tok / sp * logits / GIB * frag
        # what the approximate memory savers claim in the update (activation offload keeps a quarter, entropy
        # checkpointing and chunking drop logits copies): uncertain until a config with them on is measured
        act_full = self._act_per_token({**k, "act_off": np.zeros_like(k["act_off"])})
        sv_upd = {"act_off": peak_tok / sp * act_full * 0.75 * k["act_off"] / GIB * frag,
                  "ent_ckpt": peak_tok / sp * 2.0 * self.V * k["ent_ckpt"] / GIB * frag,
                  "ent_chunk": peak_tok / sp * self.V * k["ent_chunk"] / GIB * frag}
        m_upd = res["params_all"] + res["grads"] + res["optim_all"] + res["ref"] + gathered + kept_kv + act_upd + self.ctx_gb
        if self.memory.coef is not None:
            probed = self._probed_training(k, w, res, seqs_gpu, sp, n_mini, peak_tok, frag, kept_kv, act_full)
            (m_old, act_old, lg_old, m_ref, act_ref, lg_ref, m_upd, act_upd, lg_upd) = probed
        saves = {f"sv:{kn}:update_actor": v for kn, v in sv_upd.items()}
        saves.update({"sv:ent_chunk:old_log_prob": sv_old, "sv:ent_chunk:ref": sv_ref})
        tok_old = self._micro(k, w, seqs_gpu, k["lp_micro"], k["tok_cap"])[2] / sp
        tok_ref = self._micro(k, w, seqs_gpu, k["ref_micro"], k["tok_cap"])[2] / sp
        return {**saves, "tok_upd": peak_tok / sp, "tok_old": tok_old, "tok_ref": tok_ref, "t_old": t_old, "t_ref": t_ref, "t_upd": t_upd, "m_old": m_old, "m_ref": m_ref, "m_upd": m_upd,
                "u_old": act_old, "u_ref": act_ref, "u_upd": act_upd, "l_old": lg_old, "l_ref": lg_ref, "l_upd": lg_upd}

    def _probed_training(self, k: dict, w: Workload, res: dict, seqs_gpu: float, sp: np.ndarray, n_mini: float,
                         peak_upd: np.ndarray, frag: np.ndarray, kept_kv: np.ndarray, act_full: np.ndarray) -> tuple:
        """The training phases' memory from torch's accounting (``self.memory.coef``: full-depth peak = a + b x
        tokens of the largest micro batch; parameters, gathered units, the gradients and Adam state present at
        the peak included), with the job's other residents on top. Knobs the probe does not vary act as the
        formula's deltas: FSDP1's fragmentation, activation offload, entropy chunking/checkpointing."""
        if self.memory.coef is None:
            raise RuntimeError("the probe's figures are needed here")
        coef: Coefficients = self.memory.coef
        shard = self.P / self.N / GIB
        fsdp1 = frag / 0.93  # the probe measured FSDP2 (frag 0.93); FSDP1 keeps 1/0.93 of it
        others = res["params_all"] - 4 * shard  # a team's other policies on the device
        ckpt = k["ckpt"] > 0
        fused = 1.0 if self.job.logits_path == "fused" else 0.0

        def split(phase: str, on: Any, tok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """(static, per-token share x tokens) in GiB at the peak's moment (by checkpointing where ``on``)."""
            def one(c: bool) -> tuple[np.ndarray, np.ndarray]:
                both = coef.parts(phase, c, ("total", "activations"), tok)
                total, act = both["total"], both["activations"]
                return np.asarray(total - act) / GIB, np.asarray(act) / GIB
            (s0, d0), (s1, d1) = one(False), one(True)
            return np.where(on, s1, s0), np.where(on, d1, d0)

        def logprob(micro: np.ndarray) -> tuple:
            tok = self._micro(k, w, seqs_gpu, micro, k["tok_cap"])[2] / sp
            a, dyn = split("logprob", False, tok)
            dyn = dyn - fused * tok * FUSED_LOGITS_SAVING["logprob"] * self.V / GIB
            dyn = dyn * fsdp1 - tok * 4.0 * self.V * k["ent_chunk"] / GIB
            logits = np.minimum(tok * np.where(k["ent_chunk"] > 0, 3.0, 7.0) * self.V / GIB, dyn)
            return a, dyn, logits

        a_old, act_old, lg_old = logprob(k["lp_micro"])
        # verl reloads offloaded actor parameters for compute_log_prob: the probe's fp32 shard is always there
        m_old = a_old + act_old + res["optim"] + res["ref"] + others + kept_kv + self.ctx_gb
        if w.uses_ref:
            a_ref, act_ref, lg_ref = logprob(k["ref_micro"])
            # the reference holds a bf16 shard where the probe's actor held its fp32 one
            m_ref = a_ref - 2 * shard + act_ref + res["params"] + res["optim"] + others + kept_kv + self.ctx_gb
        else:
            act_ref = lg_ref = m_ref = np.zeros_like(m_old)
        tok = peak_upd / sp
        a, dyn = split("update", ckpt, tok)
        dyn = dyn - fused * tok * FUSED_LOGITS_SAVING["update"] * self.V / GIB
        logits_f = self.V * 8.0 * tok / GIB  # the probe's non-fused log-prob path; savers below trim it
        dyn = dyn - 0.75 * k["act_off"] * np.maximum(dyn - logits_f, 0.0)
        dyn = (dyn - tok * self.V * (2.0 * k["ent_ckpt"] + k["ent_chunk"]) / GIB) * fsdp1
        lg_upd = np.minimum(tok * (self.V * np.where(k["ent_ckpt"] > 0, 6.0, 8.0) - self.V * k["ent_chunk"]) / GIB,
                            dyn)
        m_upd = a + dyn + res["ref"] + others + kept_kv + self.ctx_gb
        return m_old, act_old, lg_old, m_ref, act_ref, lg_ref, m_upd, dyn, lg_upd

    def _other(self, k: dict, w: Workload) -> dict[str, np.ndarray]:
        tp = np.maximum(k["tp"], 1)
        W = 2 * self.P
        sync = W * (self.N - 1) / max(self.N, 1) / (self.coll_bw * self.cal.comm_mult) + 0.5
        sync = sync + k["param_off"] * self._offload_s(4 * self.P / self.N)
        wake = k["free_cache"] * (0.5 + W / tp / self.host_bw) * (0.0 if self.cpu else 1.0)
        return {"t_other": sync * (0.0 if self.cpu else 1.0) + wake + 0.2 + w.seqs * 3e-4}

    # -- calibrated prediction ---------------------------------------------------------------------
    def _time_correction(self, k: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
        """Per-phase log scale at each config: similarity-weighted mean of the measured log residuals.

        Similarity is per phase, over the knobs that phase's time depends on (``PHASE_TIME_KNOBS``): a
        trial that changed only training knobs says nothing new about the rollout's residual, so it must
        not outweigh an older trial that ran the same rollout. (With one distance over every knob, the
        residual of the latest trials' rollout leaked into every other rollout shape they resembled in
        training knobs, and a rollout the model mispriced could never be corrected back.)"""
        obs = self.cal.time_obs
        if not obs:
            return {p: np.zeros(size) for p in PHASES}
        # one row per observation, one column per config: the search evaluates 10^4-10^5 configs per call
        dyn = (np.asarray(k["dyn"], dtype=float) > 0)[None, :]
        dyn_obs = np.array([float(ko["dyn"]) > 0 for ko, _ in obs])[:, None]
        out = {}
        cache: dict[tuple[str, ...], np.ndarray] = {}
        for p in PHASES:
            names = PHASE_TIME_KNOBS[p]
            if names not in cache:
                d = np.zeros((len(obs), size))
                for name in names:
                    a = np.asarray(k[name], dtype=float)[None, :]
                    b = np.array([float(ko[name]) for ko, _ in obs])[:, None]
                    if name in MICRO_KNOBS:  # ignored under dynamic bsz (the token cap sets the shape)
                        same = dyn & dyn_obs
                    elif name == "tok_cap":  # ignored with static micro batches
                        same = ~dyn & ~dyn_obs
                    else:
                        same = np.zeros((1, 1), dtype=bool)
                    if name in NUMERIC_KNOBS:
                        step = np.minimum(np.abs(np.log2(np.maximum(a, 1e-3) / np.maximum(b, 1e-3))), 2.0)
                        step = step * (1.0 if name in ("tp", "sp") else 0.5)  # TP/SP change the layout
                    else:
                        step = (a != b).astype(float)
                    d = d + np.where(same, 0.0, step)
                cache[names] = np.exp(-KERNEL * d) + 1e-3
            weights = cache[names]
            res = np.array([r.get(p, 0.0) for _, r in obs], dtype=float)[:, None]
            out[p] = (weights * res).sum(axis=0) / weights.sum(axis=0)
        return out

    def evaluate(self, k: dict[str, Any], w: Workload) -> dict[str, Any]:
        """Calibrated times, memories, step time, throughput and peak for knob arrays ``k``."""
        size = int(np.broadcast(*[np.asarray(v) for v in k.values()]).size)
        k = {name: np.broadcast_to(np.asarray(v, dtype=float), (size,)) for name, v in k.items()}
        raw = self.raw(k, w)
        corr = self._time_correction(k, size)
        t = {"gen": raw["t_gen"], "old_log_prob": raw["t_old"], "ref": raw["t_ref"], "update_actor": raw["t_upd"],
             "other": raw["t_other"]}
        t = {p: np.asarray(v, dtype=float) * np.exp(corr[p]) for p, v in t.items()}
        bias = self.cal.mem_bias
        unc = self._uncertain(raw)
        m = self._calibrated_memory(raw, self.cal.act_scale, bias)
        step = sum(t.values())
        peak = np.maximum.reduce(list(m.values()))
        gaps = self.phase_gaps(self._components(raw))
        # the effective gap: the peak plus it must stay under the limit exactly when every phase plus its own
        # gap does
        gap = np.maximum.reduce([np.where(m[p] > 0, m[p] + gaps[p], 0.0) for p in MEM_PHASES]) - peak
        return {"t": t, "m": m, "step": step, "peak": peak, "gap": gap, "gap_phase": gaps, "throughput": w.tokens / (step * self.N),
                "kv_fail": np.asarray(raw["kv_fail"]), "raw_m": {p: np.asarray(v) for p, v in
                                                                  zip(MEM_PHASES, (raw["m_gen"], raw["m_old"], raw["m_ref"], raw["m_upd"]))},
                "concurrency": raw["concurrency"], "unc": unc}

    @staticmethod
    def _components(raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Estimated memory terms per phase and kind (saved activations vs logits): each carries its own error."""
        out = {"gen": np.asarray(raw["u_gen"], dtype=float)}
        out.update({key: np.asarray(v, dtype=float) for key, v in raw.items() if key.startswith("sv:")})
        for p, tag in (("old_log_prob", "old"), ("ref", "ref"), ("update_actor", "upd")):
            lg = np.asarray(raw[f"l_{tag}"], dtype=float)
            out[p + ":act"] = np.asarray(raw[f"u_{tag}"], dtype=float) - lg
            out[p + ":logits"] = lg
        return out

    @staticmethod
    def _uncertain(raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model-estimated (not datasheet-exact) part of each phase's memory: activations, logits, graphs."""
        return {"gen": np.asarray(raw["u_gen"], dtype=float), "old_log_prob": np.asarray(raw["u_old"], dtype=float),
                "ref": np.asarray(raw["u_ref"], dtype=float), "update_actor": np.asarray(raw["u_upd"], dtype=float)}

    @classmethod
    def _calibrated_memory(cls, raw: dict[str, np.ndarray], scales: tuple[float, float],
                           bias: dict[str, float]) -> dict[str, np.ndarray]:
        unc = cls._uncertain(raw)
        logits = {"old_log_prob": raw["l_old"], "ref": raw["l_ref"], "update_actor": raw["l_upd"]}
        m = {"gen": raw["m_gen"], "old_log_prob": raw["m_old"], "ref": raw["m_ref"], "update_actor": raw["m_upd"]}
        out = {}
        for p, v in m.items():
            v = np.asarray(v, dtype=float)
            if p != "gen":
                lg = np.asarray(logits[p], dtype=float)
                v = v + (scales[0] - 1.0) * (unc[p] - lg) + (scales[1] - 1.0) * lg
            out[p] = np.where(np.asarray(m[p]) > 0, v + bias.get(p, 0.0), 0.0)
        return out

    def predict(self, config: dict[str, Any]) -> Prediction:
        k = self.knobs(config)
        w = self.workload(config)
        e = self.evaluate({n: np.array([v]) for n, v in k.items()}, w)
        peak = float(e["peak"][0])
        return Prediction(
            throughput=float(e["throughput"][0]), step_s=float(e["step"][0]),
            phase_s={p: float(v[0]) for p, v in e["t"].items()}, phase_gb={p: float(v[0]) for p, v in e["m"].items()},
            peak_gb=peak, kv_fail=bool(e["kv_fail"][0]), confidence=self.confidence(),
            gap_gb=float(e["gap"][0]),
        )

    # -- accuracy and safety gap -------------------------------------------------------------------
    def confidence(self) -> float:
        """0..1: how well the model predicted the trials measured so far (1 = within noise)."""
        errs = self.cal.peak_errors[-4:]
        terrs = self.cal.throughput_errors[-4:]
        if not errs and not terrs:
            return 0.3
        pe = math.sqrt(sum(e * e for e in errs) / len(errs)) / max(self.C, 1e-9) if errs else 0.05
        te = math.sqrt(sum(e * e for e in terrs) / len(terrs)) if terrs else 0.1
        return float(max(0.0, min(1.0, 1 - 8 * pe - 3 * te)))

    def base_gap_gb(self) -> float:
        """Safety gap under the limit: 6% of capacity before any check, then 1.5 x the RMS error of the
        last predicted peaks (never below a measurement-noise floor)."""
        floor = max(0.005 * self.C, 0.3 if not self.cpu else 0.0)
        errs = self.cal.peak_errors[-4:]
        if not errs:
            return 0.06 * self.C
        rms = math.sqrt(sum(e * e for e in errs) / len(errs))
        return float(min(0.08 * self.C, max(floor, 1.5 * rms + 0.5 * max(0.0, max(errs)))))

    def phase_gaps(self, parts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Safety gap of each phase: the base gap + a share of how far the phase's estimated memory terms
        (activations, logits, CUDA graphs) are from the nearest measured config's. Datasheet terms (shards,
        the memory share) are exact; the estimated ones carry the model's error, so extrapolating them is
        less certain (their error scales with the change since the bias was fitted)."""
        base = self.base_gap_gb()
        # relative error of textbook activation estimates: ~35% untested, less once the model proves accurate
        kappa = (0.35 - 0.15 * self.confidence()) * max(self.cal.act_scale)
        out: dict[str, Any] = {}
        for p in MEM_PHASES:
            keys = ["gen"] if p == "gen" else [p + ":act", p + ":logits"]
            dist: Any
            if not self._mem_refs:
                dist = sum(parts[q] for q in keys)
            else:
                dist = None
                for ref in self._mem_refs:
                    d = sum(np.abs(parts[q] - ref[q]) for q in keys)
                    dist = d if dist is None else np.minimum(dist, d)
            out[p] = base + kappa * dist
            # a memory saver never measured on: half of what it claims is held back in the gap
            for key, v in parts.items():
                if key.startswith("sv:") and key.endswith(":" + p) and key.split(":")[1] not in self._measured_on:
                    out[p] = out[p] + UNTESTED_SAVING_SHARE * v
        return out

    # -- calibration --------------------------------------------------------------------------------
    def fit(self, observations: list[Observation]) -> "JobModel":
        """Refit every constant on the measured trials (call after each trial)."""
        cal = Calibration()
        self.cal = cal
        self._mem_refs = []
        self._measured_on = set()
        usable = [o for o in observations if o.phases and not o.oom]
        latest = next((o for o in reversed(observations) if o.resp_mean), None)
        if latest is not None:
            self.workload_obs = latest
        # accuracy record: errors of predictions made before each trial ran
        for o in observations:
            if o.predicted_peak_gb is not None:
                measured = max(o.peak_gb or 0.0, self.C if o.oom else 0.0)
                if measured > 0:
                    cal.peak_errors.append(measured - o.predicted_peak_gb)
            if o.predicted_throughput and o.throughput:
                cal.throughput_errors.append(math.log(o.throughput / o.predicted_throughput))
        # structural constants: least squares over a small grid once enough configs differ
        if len(usable) >= 3:
            best = (math.inf, 1.0, 1.0, 1.0)
            stacked = self._stack(usable)
            # the collective bandwidth last, so a tie keeps the described link (1.0 is tried first)
            for cm in (1.0, 0.7, 1.4, 0.5, 2.0):
                for so in (0.25, 0.5, 1.0, 2.0, 4.0):
                    for km in (0.25, 0.5, 1.0, 2.0, 4.0):
                        cal.step_overhead_mult, cal.knee_mult, cal.comm_mult = so, km, cm
                        err = self._residual_spread(usable, stacked)
                        if err < best[0] - 1e-9:
                            best = (err, so, km, cm)
            cal.step_overhead_mult, cal.knee_mult, cal.comm_mult = best[1], best[2], best[3]
        elif usable:
            cal.knee_mult, cal.comm_mult = self._fit_shape(usable)
        for o in usable:
            k = self.knobs(o.config)
            w = self.workload(o.config)
            raw = self.raw({n: np.array([v]) for n, v in k.items()}, w)
            pred = {"gen": raw["t_gen"][0], "old_log_prob": raw["t_old"][0], "ref": raw["t_ref"][0],
                    "update_actor": raw["t_upd"][0], "other": raw["t_other"][0]}
            res = {p: math.log(max(o.phases[p], 1e-6) / max(float(pred[p]), 1e-9))
                   for p in PHASES if o.phases.get(p) and float(pred[p]) > 0}
            cal.time_obs.append((k, res))
        self._fit_memory(observations)
        return self

    def _fit_shape(self, usable: list[Observation]) -> tuple[float, float]:
        """(GEMM knee, collective bandwidth) multipliers from one or two trials: too few to fit the spread, so
        the training passes' and the weight sync's log residuals themselves are fitted, pulled towards 1.

        Why: the flat residual of one trial is carried to every config. A first trial on small static micro
        batches (verl's defaults) runs slower than the model says mostly through what each micro batch costs
        (an FSDP all-gather that the link's real bandwidth makes slower, a device the small GEMMs fill worse);
        carried flat, that error made every large dynamic-bsz config (few micro batches) look as slow, and the
        search under-rated them. These two terms shrink with fewer, larger micro batches, a flat scale does
        not; whatever they cannot explain stays in the residual that is carried."""
        keys = (("old_log_prob", "t_old"), ("ref", "t_ref"), ("update_actor", "t_upd"), ("other", "t_other"))
        rows = [(o, self.knobs(o.config), self.workload(o.config)) for o in usable]
        best = (math.inf, 1.0, 1.0)
        for cm in (1.0, 0.7, 0.5, 0.35, 1.4, 2.0):
            for km in (1.0, 0.5, 2.0, 4.0, 8.0):
                self.cal.knee_mult, self.cal.comm_mult = km, cm
                err = SHAPE_PRIOR * (math.log(km) ** 2 + math.log(cm) ** 2)
                for o, k, w in rows:
                    raw = self.raw({n: np.array([v]) for n, v in k.items()}, w)
                    for p, key in keys:
                        if o.phases.get(p) and float(raw[key][0]) > 0:
                            err += math.log(o.phases[p] / float(raw[key][0])) ** 2
                if err < best[0] - 1e-9:
                    best = (err, km, cm)
        self.cal.knee_mult, self.cal.comm_mult = 1.0, 1.0
        return best[1], best[2]

    def _stack(self, usable: list[Observation]) -> tuple[dict[str, np.ndarray], Workload] | None:
        """The usable trials' knobs as arrays for one vectorised evaluation (None when their workloads differ)."""
        ws = [self.workload(o.config) for o in usable]
        if any(w != ws[0] for w in ws[1:]):
            return None
        ks = [self.knobs(o.config) for o in usable]
        return {n: np.array([k[n] for k in ks]) for n in KNOBS}, ws[0]

    def _residual_spread(self, usable: list[Observation], stacked: tuple | None = None) -> float:
        per_phase: dict[str, list[float]] = {}
        if stacked is not None:
            raw = self.raw(*stacked)
            preds = [{"gen": raw["t_gen"][i], "old_log_prob": raw["t_old"][i], "update_actor": raw["t_upd"][i]}
                     for i in range(len(usable))]
        else:
            preds = []
            for o in usable:
                raw = self.raw({n: np.array([v]) for n, v in self.knobs(o.config).items()}, self.workload(o.config))
                preds.append({"gen": raw["t_gen"][0], "old_log_prob": raw["t_old"][0], "update_actor": raw["t_upd"][0]})
        for o, pred in zip(usable, preds):
            for p, v in pred.items():
                if o.phases.get(p) and float(v) > 0:
                    per_phase.setdefault(p, []).append(math.log(o.phases[p] / float(v)))
        return sum(float(np.var(v)) * len(v) for v in per_phase.values() if len(v) > 1)

    def _fit_memory(self, observations: list[Observation]) -> None:
        """Activation scale and additive per-phase biases from the measured peaks.

        Each measured peak bounds every phase from above (up to noise) and must be reached by one of them:
        a peak above the prediction raises the bias of every phase that could have produced it (all phases
        within reach of the predicted top), never only the one the model thinks binds. An OOM says the
        peak reached the capacity. The activation scale (one factor on the estimated terms of the training
        phases) is chosen from a grid to fit the peaks once two or more were measured; it starts at the
        textbook (1.0, 1.0), the phase gaps holding the estimate's error.
        """
        rows = [row for o in observations if (row := self._memory_row(o)) is not None]
        if not rows:
            self.cal.mem_bias = {p: 0.02 * self.C for p in MEM_PHASES}
            return
        prior = Calibration().act_scale
        if len(rows) >= 2:
            grid = [(a, b) for a in (0.7, 0.85, 1.0, 1.15, 1.3, 1.5, 1.75, 2.0, 2.4)
                    for b in (0.6, 0.8, 1.0, 1.2, 1.5, 2.0)]
        else:
            grid = [prior]
        best = None
        for sc in grid:
            bias = self._biases(rows, sc)
            err = self._memory_error(rows, sc, bias, prior)
            if best is None or err < best[0] - 1e-9:
                best = (err, sc, bias)
        assert best is not None  # the grid is never empty
        self.cal.act_scale, self.cal.mem_bias = best[1], best[2]

    def _memory_row(self, o: Observation) -> tuple | None:
        """One observation as the memory fit reads it (raw terms, measured peak, OOM, per-phase peaks), or None
        when it measured no memory; a measured one also becomes a reference of the knobs it was measured on."""
        measured = o.peak_gb if o.peak_gb is not None and o.peak_gb > 0 else None
        if o.oom:
            measured = max(measured or 0.0, self.C)
        if measured is None and not o.phase_peaks:
            return None
        k = self.knobs(o.config)
        raw = self.raw({n: np.array([v]) for n, v in k.items()}, self.workload(o.config))
        if not o.oom:
            self._mem_refs.append({p: float(v[0]) for p, v in self._components(raw).items()
                                   if not p.startswith("sv:")})
            self._measured_on |= {n for n in ("act_off", "ent_ckpt", "ent_chunk") if k[n] > 0}
        return raw, measured, o.oom, {p: v for p, v in (o.phase_peaks or {}).items() if p in MEM_PHASES}

    def _memory_error(self, rows: list, sc: tuple[float, float], bias: dict[str, float],
                      prior: tuple[float, float]) -> float:
        """How badly the activation scales ``sc`` with their biases explain the measured peaks."""
        err = 0.0
        for raw, measured, oom, phase in rows:
            cm = self._calibrated_memory(raw, sc, bias)
            top = max(float(v[0]) for v in cm.values())
            # an OOM only says the peak reached the capacity: penalise predicting less
            if measured is not None:
                err += max(0.0, measured - top) ** 2 if oom else (top - measured) ** 2
            # a phase measured on its own (a fit probe) is fitted as such
            err += sum((float(cm[p][0]) - v) ** 2 for p, v in phase.items())
        # large biases mean the scales explain the peaks badly; stay near the prior otherwise
        # (the rollout's bias is not held against the scales: no scale reaches the rollout's memory, so its
        # bias is the only way to explain a rollout peak, and penalising it made the activation scales grow
        # to explain a rollout that peaked 1 GB above its prediction)
        train_bias = [v for p, v in bias.items() if p != "gen"]
        err += 0.3 * sum(v * v for v in train_bias) / len(train_bias)
        return err + 0.005 * self.C ** 2 * sum(math.log(x / p0) ** 2 for x, p0 in zip(sc, prior))

    def _biases(self, rows: list, act_scale: tuple[float, float]) -> dict[str, float]:
        # measurement noise of a peak: ~0.1 GB on a GPU, a few percent of an emulated CPU device's capacity
        noise = min(0.1, 0.05 * self.C) + 0.002 * self.C
        bias = {p: 0.02 * self.C for p in MEM_PHASES}
        preds = []
        exact: dict[str, list[float]] = {}
        for raw, measured, oom, phase in rows:
            pm = {p: float(v[0]) for p, v in self._calibrated_memory(raw, act_scale, {}).items()}
            preds.append((pm, measured, oom))
            for p, v in phase.items():
                if pm[p] > 0:
                    exact.setdefault(p, []).append(v - pm[p])
        upper = {p: math.inf for p in MEM_PHASES}
        for pm, measured, oom in preds:
            if oom or measured is None:
                continue
            for p in MEM_PHASES:
                if pm[p] > 0:
                    upper[p] = min(upper[p], measured + noise - pm[p])
        for p in MEM_PHASES:
            if math.isfinite(upper[p]):
                bias[p] = min(bias[p], upper[p])
        # a phase measured on its own sets its bias (the largest residual: a safe side); no peak of another
        # trial needs to be explained by it any more
        for p, res in exact.items():
            bias[p] = max(res)
        for _ in range(3):
            for pm, measured, oom in preds:
                pred = {p: pm[p] + bias[p] for p in MEM_PHASES if pm[p] > 0}
                top = max(pred.values())
                if measured is None or measured <= top:
                    continue
                reach = max(0.1 * self.C, 2 * noise)
                for p, v in pred.items():
                    if v >= top - reach and p not in exact:
                        bias[p] = min(max(bias[p], measured - pm[p]), upper[p])
        return bias


_NORMAL = NormalDist()


@lru_cache(maxsize=256)  # the same observation is refitted for every workload the model prices
def response_length_fit(mean: float, longest: float, clip_ratio: float | None, limit: float,
                        draws: float) -> tuple[float, float] | None:
    """(mu, sigma) of the lognormal response lengths (log scale), truncated at ``limit``, that a step's measured
    mean, longest and clipped share imply (verl's ``response_length/mean``, ``/max``, ``/clip_ratio``), or None
    when they fit none.

    Generated lengths are positive and right-skewed; the lognormal is the two-parameter shape fitted here. Two
    facts fix it: the truncated mean, and one upper quantile, which is the limit with the clipped share above it
    when responses were cut there, else the longest of ``draws`` responses at its median quantile,
    1 - ln 2 / draws (the longest of n draws is below x with probability F(x)^n)."""
    if not (mean > 0 and longest > mean and limit > 0):
        return None
    if clip_ratio and clip_ratio > 0 and longest >= 0.98 * limit:
        upper, tail = limit, clip_ratio
    else:
        upper, tail = min(longest, limit), math.log(2) / max(draws, 2.0)
    if not 0 < tail < 0.5 or mean >= upper:
        return None
    z = _NORMAL.inv_cdf(1 - tail)
    log_u = math.log(upper)

    def truncated_mean(sigma: float) -> float:
        return truncated_lognormal_moments(log_u - sigma * z, sigma, limit)[0]

    # sigma -> 0 puts every length at ``upper`` (the mean above the measured one); towards sigma = z the mass
    # moves far below it: the measured mean lies between, on the branch where a wider spread lowers the mean
    lo, hi = 1e-6, z
    if truncated_mean(hi) > mean:
        return None
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if truncated_mean(mid) > mean:
            lo = mid
        else:
            hi = mid
    sigma = 0.5 * (lo + hi)
    return log_u - sigma * z, sigma


def truncated_lognormal_moments(mu: float, sigma: float, limit: float) -> tuple[float, float]:
    """(E[L], E[L^2]) of lognormal(mu, sigma) lengths cut at ``limit`` (a cut response has the limit's length)."""
    a = (math.log(limit) - mu) / sigma
    above = 1 - _NORMAL.cdf(a)
    e1 = math.exp(mu + sigma * sigma / 2) * _NORMAL.cdf(a - sigma) + limit * above
    e2 = math.exp(2 * mu + 2 * sigma * sigma) * _NORMAL.cdf(a - 2 * sigma) + limit * limit * above
    return e1, e2


def _cut_limit(obs: Observation | None) -> float | None:
    """The response limit an observed trial's responses were cut at (its longest reached it, or some were
    clipped), else None: lengths measured under it say nothing about a longer limit's tail."""
    if obs is None:
        return None
    limit = obs.config.get("data.max_response_length")
    if not isinstance(limit, (int, float)) or limit <= 0:
        return None
    cut = (obs.clip_ratio or 0.0) > 0 or (obs.resp_max is not None and obs.resp_max >= 0.98 * limit)
    return float(limit) if cut else None


def observation_from_records(config: dict[str, Any], records: list[Any], *, peak_gb: float | None, oom: bool,
                             throughput: float | None, window: tuple[int, int],
                             predicted_peak_gb: float | None = None,
                             predicted_throughput: float | None = None) -> Observation:
    """An ``Observation`` from a trial's metric records (verl's keys), phase times averaged over ``window``."""
    first, last = window
    rows = [r for r in records if first <= r.step <= last] or list(records)

    def mean(key: str) -> float | None:
        vals = [r.data[key] for r in rows if key in r.data and r.data[key] is not None and math.isfinite(r.data[key])]
        return sum(vals) / len(vals) if vals else None

    def phase(p: str) -> float | None:  # on the clock the throughput is compared on (the local trainer's CPU time)
        vals = [v for r in rows if (v := phase_seconds(r, p)) is not None and math.isfinite(v)]
        return sum(vals) / len(vals) if vals else None

    phases: dict[str, float] = {}
    for p in ("gen", "old_log_prob", "ref", "update_actor"):
        v = phase(p)
        if v is not None:
            phases[p] = v
    step = phase("step")
    other = [phase(p) for p in OTHER_TIMINGS]
    if any(v is not None for v in other):
        phases["other"] = sum(v for v in other if v is not None)
    elif step is not None and phases:
        phases["other"] = max(step - sum(phases.values()), 1e-3)
    return Observation(config=config, phases=phases, peak_gb=peak_gb, oom=oom, throughput=throughput,
                       resp_mean=mean("response_length/mean"), resp_max=mean("response_length/max"),
                       prompt_mean=mean("prompt_length/mean"), clip_ratio=mean("response_length/clip_ratio"),
                       predicted_peak_gb=predicted_peak_gb,
                       predicted_throughput=predicted_throughput)
