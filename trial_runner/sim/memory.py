"""The simulator's memory truth: torch's own accounting of each scenario architecture, precomputed as data.

``memory_truth.json`` (written by ``scripts/memory_truth.py sim``) holds, per model name, torch's per-rank peak
of a training step (``update``, by gradient checkpointing) and of a no-grad log-prob pass (``logprob``) of the
real Hugging Face module under FSDP2 (fake tensors and a fake process group of ``world`` ranks; see
``mart.trial_runner.memory_probe`` and docs/sim.md), per moment of the step a line ``a + b x tokens`` of the micro
batch (the highest is the peak) in two shares: what FSDP shards over the ranks (fp32 parameters, gradients and Adam state at the peak: scaled by world / GPUs) and
the rest (gathered bf16 units, activations, logits and their temporaries). The simulator reads only this file:
it never calls the probe nor the tuner's job model, so the judge does not share the tuner's code. A scenario
whose model is not in the file keeps the simulator's own textbook count (``system.layer_activation_bytes``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from mart.trial_runner.sim.job import GIB, Scenario

DATA = Path(__file__).resolve().parent / "memory_truth.json"


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    try:
        return json.loads(DATA.read_text())
    except (OSError, ValueError):
        return {"models": {}}


def truth_for(sc: Scenario) -> dict[str, Any] | None:
    """The scenario model's entry (by its name, then its Hugging Face path), or None."""
    models = table().get("models", {})
    entry = models.get(sc.model.name)
    if entry is None:
        entry = next((e for e in models.values() if e.get("hf_path") == sc.model.hf_path), None)
    # an entry measured on another architecture under the same name would be wrong: shapes must agree
    if entry is not None and (entry["layers"], entry["hidden"]) != (sc.model.layers, sc.model.hidden):
        return None
    return entry


def peak_gb(sc: Scenario, entry: dict[str, Any], phase: str, ckpt: Any, tokens: Any,
            per_token_scale: Any = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(the phase's static GiB on this scenario's ranks, its per-token GiB x ``tokens``) at the peak's moment,
    from torch's accounting; ``per_token_scale`` multiplies the per-token share (the scenario's perturbed
    activation constant, FSDP1). Each recorded moment is a line; the highest on these ranks is the peak."""
    world = float(table().get("world", 8))
    ckpt = np.asarray(ckpt, dtype=float) > 0
    if phase == "logprob":  # checkpointing does not act without gradients
        ckpt = np.zeros_like(ckpt)
    tok = np.asarray(tokens, dtype=float)
    best_static = best_dyn = None
    for on in (False, True):
        for line in entry[phase][str(int(on))]:
            (sa, sb), (ra, rb) = line["sharded"], line["rest"]
            static = (sa * world / sc.n_gpus + ra) / GIB + 0 * tok
            dyn = (sb * world / sc.n_gpus + rb) * tok * per_token_scale / GIB
            mask = ckpt == on
            if best_static is None:
                best_static, best_dyn = np.full(np.broadcast(static, dyn, ckpt).shape, -np.inf), np.zeros(
                    np.broadcast(static, dyn, ckpt).shape)
            better = mask & (static + dyn > best_static + best_dyn)
            best_static = np.where(better, static, best_static)
            best_dyn = np.where(better, dyn, best_dyn)
    return best_static, best_dyn


__all__ = ["DATA", "peak_gb", "table", "truth_for"]
