"""The discretised system space the exhaustive ground truths enumerate, and its link to verl's keys.

The grids (``ROLLOUT_GRID``, ``TRAIN_*``, ``SHARED``) are columns of ``system`` knob values; the single-agent
(``model.ground_truth``) and multi-agent (``multi_agent.ground_truth``) optima both search them, so they
live here, below both. ``knobs_to_overrides`` maps a grid point back to verl config keys.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mart.state.search_space import SearchSpace
from mart.trial_runner.sim import system as S
from mart.trial_runner.sim.catalogue import search_space

ROLLOUT_GRID: dict[str, list[float]] = {
    "util": [round(0.20 + 0.01 * i, 2) for i in range(76)],
    "tp": [1, 2, 4, 8],
    "max_num_seqs": [64, 128, 256, 384, 512, 768, 1024, 1536, 2048],
    "mnbt": [2048, 4096, 8192, 16384, 32768],
    "chunked": [0, 1],
    "prefix": [0, 1],
    "eager": [0, 1],
}
TRAIN_STATIC = {"ppo_micro": [1, 2, 4, 8, 16, 32, 64], "lp_micro": [1, 2, 4, 8, 16, 32, 64, 128]}
TRAIN_DYNAMIC = {"tok_cap": [4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152, 65536]}
TRAIN_FLAGS = {
    "grad_ckpt": [0, 1],
    "act_off": [0, 1],
    "remove_pad": [0, 1],
    "ent_chunk": [0, 1],
    "ent_ckpt": [0, 1],
    "fsdp2": [0, 1],
    "sp": [1, 2, 4, 8],
}
SHARED = {"param_off": [0, 1], "opt_off": [0, 1], "free_cache": [0, 1]}

_KNOB_TO_KEY = {name: key for name, (key, _) in S.SYSTEM_KEYS.items()}


def knobs_to_overrides(knobs: dict[str, float]) -> dict[str, Any]:
    """Inverse of ``system.knobs_from_config`` for the knobs given (bools and strategy restored)."""
    space = search_space()
    out: dict[str, Any] = {}
    for name, value in knobs.items():
        key = _KNOB_TO_KEY.get(name)
        if key is None:
            continue
        if name == "fsdp2":
            out[key] = "fsdp2" if value else "fsdp"
        elif key in space and space[key].kind == "bool":
            out[key] = bool(value)
        elif key in space and space[key].kind in ("int", "categorical"):
            out[key] = int(value)
        else:
            out[key] = float(value)
    return out


def grid_columns(axes: dict[str, list[float]]) -> dict[str, np.ndarray]:
    names = list(axes)
    mesh = np.meshgrid(*[np.asarray(axes[n], dtype=float) for n in names], indexing="ij")
    return {n: m.ravel() for n, m in zip(names, mesh)}


def valid_mask(space: SearchSpace, grid: dict[str, np.ndarray], keys: list[str], cfg0: dict[str, Any]) -> np.ndarray:
    """Evaluate ``space``'s constraints once per distinct combination of ``keys`` (the grid's columns) on
    top of ``cfg0``."""
    cols = np.stack([grid[k] for k in keys], axis=1)
    uniq, inverse = np.unique(cols, axis=0, return_inverse=True)
    ok = np.empty(len(uniq), dtype=bool)
    for i, row in enumerate(uniq):
        cfg = {**cfg0, **knobs_to_overrides(dict(zip(keys, row.tolist())))}
        ok[i] = not space.check_constraints(cfg)
    return ok[inverse.ravel()]


def train_grid(k0: dict[str, Any], cfg0: dict[str, Any]) -> dict[str, np.ndarray]:
    """The training-side combinations the exhaustive optimum enumerates (static and dynamic batching), as
    columns; knobs a side does not vary keep the base config's value (``k0``)."""
    static = grid_columns({**TRAIN_STATIC, **TRAIN_FLAGS, "dyn": [0]})
    dynamic = grid_columns({**TRAIN_DYNAMIC, **TRAIN_FLAGS, "dyn": [1]})
    tgrid = {}
    for name in set(static) | set(dynamic):
        a = static.get(name, np.full(len(static["dyn"]), k0[name]))
        b = dynamic.get(name, np.full(len(dynamic["dyn"]), k0[name]))
        tgrid[name] = np.concatenate([a, b])
    tgrid["ref_micro"] = tgrid["lp_micro"].copy()
    # verl ties the log-prob token caps to the actor's unless the job sets them
    for cap_name, key in (("lp_tok_cap", S.R + "log_prob_max_token_len_per_gpu"),
                          ("ref_tok_cap", S.REF + "log_prob_max_token_len_per_gpu")):
        tgrid[cap_name] = tgrid["tok_cap"].copy() if cfg0.get(key) is None else np.full_like(tgrid["tok_cap"], k0[cap_name])
    return tgrid
