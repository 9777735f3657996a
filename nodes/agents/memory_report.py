"""Predicted peak memory of each phase of a verl config, split into its parts (``mart memory``).

The answer to "will this config OOM?" before a trial runs: the job model's per-phase memory (torch's accounting
of the architecture where the memory probe can run, the textbook count otherwise) at the worst case of the
workload (every response at ``max_response_length``, so the largest micro batch is as large as the config lets
it be), with no trial measured.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mart.nodes.agents.job_model import GIB, JobModel

#: verl's timing names of the phases, in step order
PHASE_NAMES = {"gen": "generation", "old_log_prob": "log-prob", "ref": "reference", "update_actor": "update"}
PARTS = ("parameters", "gradients", "optimizer_state", "activations", "logits", "kv_cache", "other")


def _f(v: Any) -> float:
    return float(np.asarray(v, dtype=float).reshape(-1)[0])


def phase_parts(model: JobModel, config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{phase: {"peak_gb", "parts": {part: GiB}}}``; the parts add up to the peak ("other": the CUDA context,
    a reference model's shard, vLLM's non-torch memory, and where torch saw it, what the phase's peak moment
    leaves of the gradients and optimizer state)."""
    k = model.knobs(config)
    w = model.workload(config)
    arr = {n: np.array([v]) for n, v in k.items()}
    raw = model.raw(arr, w)
    mem = model.evaluate(arr, w)["m"]
    res = model._resident_gb({n: np.asarray(v, dtype=float) for n, v in arr.items()}, w)
    kept_kv = (1 - k["free_cache"]) * k["util"] * model.C
    out: dict[str, dict[str, Any]] = {}
    for phase in PHASE_NAMES:
        peak = _f(mem[phase])
        if peak <= 0:
            continue
        parts = dict.fromkeys(PARTS, 0.0)
        if phase == "gen":
            parts["kv_cache"] = max(_f(raw["kv_pool_gb"]), 0.0)
            parts["parameters"] = 2 * model.P / max(k["tp"], 1) / GIB + _f(res["params"]) + _f(res["ref"])
            parts["optimizer_state"] = _f(res["optim"])
            parts["activations"] = _f(raw["u_gen"])  # CUDA graphs outside the memory share
        else:
            tag = {"old_log_prob": "old", "ref": "ref", "update_actor": "upd"}[phase]
            parts["logits"] = _f(raw[f"l_{tag}"])
            parts["kv_cache"] = kept_kv
            coef = model.memory.coef
            ckpt = k["ckpt"] > 0
            if phase == "update_actor":
                if coef is not None:
                    tok = _f(raw["tok_upd"])
                    parts["parameters"] = _f(coef.part("update", ckpt, "parameters", tok)) / GIB
                    parts["gradients"] = _f(coef.part("update", ckpt, "gradients", tok)) / GIB
                    parts["optimizer_state"] = _f(coef.part("update", ckpt, "optimizer_state", tok)) / GIB
                else:
                    parts["parameters"] = _f(res["params_all"])
                    parts["gradients"] = _f(res["grads"])
                    parts["optimizer_state"] = _f(res["optim_all"])
            else:
                if coef is not None:  # the fp32 shard and the gathered bf16 units (the reference: its bf16 shard)
                    tok = _f(raw["tok_old" if phase == "old_log_prob" else "tok_ref"])
                    parts["parameters"] = _f(coef.part("logprob", False, "parameters", tok)) / GIB
                    if phase == "ref":
                        parts["parameters"] += _f(res["params"]) - 2 * model.P / model.N / GIB
                else:
                    parts["parameters"] = _f(res["params_all"]) if phase == "old_log_prob" else _f(res["params"])
                parts["optimizer_state"] = _f(res["optim"])
            acts = _f(raw[f"u_{tag}"]) - parts["logits"]
            parts["activations"] = max(acts, 0.0)
        parts["other"] = peak - sum(v for key, v in parts.items() if key != "other")
        out[phase] = {"peak_gb": round(peak, 2), "parts": {key: round(v, 2) for key, v in parts.items()}}
    return out


def predict_memory(model: JobModel, config: dict[str, Any], margin: float) -> dict[str, Any]:
    """``{"phases": phase_parts, "peak_gb", "limit_gb", "fits", "source", "why"}``: fits = every phase's peak
    stays under ``(1 - margin) x`` the device's memory."""
    phases = phase_parts(model, config)
    limit = (1 - margin) * model.C
    peak = max((p["peak_gb"] for p in phases.values()), default=0.0)
    return {"phases": phases, "peak_gb": round(peak, 2), "capacity_gb": model.C, "limit_gb": round(limit, 2),
            "fits": bool(peak <= limit), "source": model.memory.source,
            **({"why_formula": model.memory.why} if model.memory.source == "formula" else {})}


__all__ = ["PARTS", "PHASE_NAMES", "phase_parts", "predict_memory"]
