"""Checkpoints of the local workload: the policy, the optimizer, the data position and the global step.

One file per checkpoint, ``<trial_dir>/checkpoints/global_step_N/checkpoint.pt`` (verl's directory
naming), written atomically (tmp + ``os.replace``): a reader, or a branch launched from it, never sees half
a file, and a crash while saving leaves the previous checkpoints intact.

What a branch restores (as verl's ``resume_mode=resume_path`` does): the actor's weights, the AdamW state
(moments and step counts), the global step and the optimizer-step counter of the learning-rate schedule,
and the data position (the prompt stream). The reference policy of the KL loss stays the base model, as
in verl (the ref is loaded from the model path, not the checkpoint). The branch's own knobs then apply:
learning rate, clip ratios, KL, entropy, temperature, batch sizes. With the parent's seed the branch also
continues the parent's rollout sampling stream, so a branch with unchanged knobs replays the parent
exactly; with another seed it draws new prompts and samples from there (a re-evaluation seed).
"""

from __future__ import annotations

import io
import os
import random
from pathlib import Path
from typing import Any

import torch

from mart.state.files import write_atomic
from mart.state.search_space import ConfigError
from mart.trial_runner.local.config import FIELDS, LocalConfig

CHECKPOINT_FILE = "checkpoint.pt"
#: keys a branch must share with its parent: they fix the shape of the saved weights
SHAPE_KEYS = tuple(k for k in FIELDS if k.startswith("local.model.") or k == "local.task.name")


def save_checkpoint(trainer: Any, step: int, directory: str | os.PathLike, flat_config: dict[str, Any]) -> Path:
    """Write the trainer's state after global step ``step`` to ``directory/checkpoint.pt`` atomically."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": 1,
        "step": int(step),
        "opt_step": int(trainer.opt_step),
        "seed": int(trainer.cfg.seed),
        "model": trainer.actor.state_dict(),
        "optimizer": trainer.opt.state_dict(),
        "rng": trainer.rng.getstate(),
        "sampler": trainer.sampler.get_state(),
        "config": {k: flat_config[k] for k in SHAPE_KEYS},
    }
    buf = io.BytesIO()  # the local workload's models are small; written whole, never through a planted link
    torch.save(payload, buf)
    return write_atomic(out, CHECKPOINT_FILE, buf.getvalue())


def load_checkpoint(trainer: Any, directory: str | os.PathLike, cfg: LocalConfig, flat_config: dict[str, Any]) -> int:
    """Restore a checkpoint into a freshly built trainer; returns the global step it was saved after.

    Raises:
        ConfigError: no checkpoint there, or the branch changes a key that fixes the weights' shape.
    """
    path = Path(directory) / CHECKPOINT_FILE
    if not path.is_file():
        raise ConfigError(f"`init_from`: no checkpoint at {path} (a step the parent saved? see save_steps).")
    # weights_only: a checkpoint is data, never code (trial dirs are untrusted)
    state = torch.load(path, map_location=trainer.device, weights_only=True)
    changed = [k for k in SHAPE_KEYS if state["config"].get(k) != flat_config.get(k)]
    if changed:
        raise ConfigError("a branch cannot change the model's shape: "
                          + ", ".join(f"`{k}` {state['config'].get(k)!r} -> {flat_config.get(k)!r}" for k in changed))
    trainer.actor.load_state_dict(state["model"])
    trainer.opt.load_state_dict(state["optimizer"])
    for group in trainer.opt.param_groups:  # the branch's knobs, not the parent's (lr is set per update)
        group["weight_decay"] = cfg.weight_decay
        group["lr"] = cfg.lr
    trainer.opt_step = int(state["opt_step"])
    step = int(state["step"])
    if int(state["seed"]) == cfg.seed:
        trainer.rng.setstate(_as_rng_state(state["rng"]))
        trainer.sampler.set_state(state["sampler"])
    else:  # a new seed: a new data order and sampling stream from the branch point on
        trainer.rng = random.Random(cfg.seed * 1_000_003 + step)
        trainer.sampler = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    return step


def _as_rng_state(v: Any) -> tuple:
    """``random.Random.setstate`` wants tuples; a round trip through the loader may give lists."""
    version, internal, gauss = v
    return int(version), tuple(int(x) for x in internal), gauss
