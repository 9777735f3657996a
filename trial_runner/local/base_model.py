"""The base model: a short, deterministic supervised warm-up on demonstrations, cached on disk.

The warm-up stops early on purpose, at partial accuracy, so GRPO has something to learn. It is keyed
by every setting it depends on and stored under ``$MART_CACHE_DIR`` (default ``~/.cache/mart``):
the first trial pays for it (seconds), later trials load it at once. Two trial processes racing to
create it are safe: one trains under a file lock while the other waits, and the file appears by an
atomic rename (tmp + ``os.replace``), so a reader never sees half of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

from mart.trial_runner.local import task as T
from mart.trial_runner.local.config import LocalConfig
from mart.trial_runner.local.grpo import model_config, task_config
from mart.trial_runner.local.model import GPT
from mart.trial_runner.local.rollout import pack, response_logits
from mart.trial_runner.local.workflow import peer_prompt

WARMUP_SEED = 1234  # the base model does not depend on the trial's seed
VERSION = 1  # bump when the model or the warm-up changes meaning


def cache_dir() -> Path:
    return Path(os.environ.get("MART_CACHE_DIR") or Path.home() / ".cache" / "mart") / "local_base_models"


def base_key(cfg: LocalConfig) -> str:
    settings = {
        "version": VERSION,
        "model": vars(model_config(cfg)),
        "task": vars(task_config(cfg)) | {"val_size": None},
        "warmup": [cfg.base_steps, cfg.base_lr, cfg.base_batch_size, cfg.base_ramble_prob, cfg.base_max_ramble, WARMUP_SEED],
    }
    if cfg.base_peer_prob > 0:  # only then: the single-agent base models keep their keys
        settings["peer_prob"] = cfg.base_peer_prob
    if cfg.task == "digit_sort_long":  # its demonstrations stop short this often
        settings["short_prob"] = T.SHORT_PROB
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def warmup(cfg: LocalConfig, device: torch.device, log: Callable[[str], None] = print) -> dict:
    """Train the base model from scratch on sorted-digit demonstrations; returns a CPU state dict."""
    torch.manual_seed(WARMUP_SEED)
    rng = random.Random(WARMUP_SEED)
    task = task_config(cfg)
    model = GPT(model_config(cfg)).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.base_lr, weight_decay=0.0)
    for it in range(cfg.base_steps):
        digits = [T.sample_digits(rng, task, "train") for _ in range(cfg.base_batch_size)]
        prompts = [_peer_prompt(d, rng, cfg) if cfg.base_peer_prob > 0 and rng.random() < cfg.base_peer_prob
                   else T.encode_prompt(d) for d in digits]
        b = pack(prompts, [T.task_demonstration(task, d, rng, cfg.base_ramble_prob, cfg.base_max_ramble)
                           for d in digits], device)
        logits = response_logits(model, b)
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b.resp_ids.reshape(-1), reduction="none")
        loss = (nll * b.resp_mask.reshape(-1)).sum() / b.resp_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (it + 1) % 20 == 0 or it + 1 == cfg.base_steps:
            log(f"base model warm-up {it + 1}/{cfg.base_steps}: loss {loss.item():.4f}")
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _peer_prompt(digits: list[int], rng: random.Random, cfg: LocalConfig) -> list[int]:
    """A task prompt followed by 1-2 rough answers (as a base model gives them: the ramble habit, a wrong
    digit half the time, a missing one a quarter of the time), in the multi-agent prompt format."""
    peers = []
    for _ in range(rng.randint(1, 2)):
        a = T.demonstration(digits, rng, cfg.base_ramble_prob, cfg.base_max_ramble)[:-1]
        if rng.random() < 0.5:
            a[rng.randrange(len(a))] = rng.randrange(10)
        if rng.random() < 0.25 and len(a) > 1:
            a = a[:-1]
        peers.append(a)
    return peer_prompt(digits, peers, cfg.max_digits + 1)


@contextlib.contextmanager
def _file_lock(path: Path):
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the atomic rename still keeps the file whole
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _try_load(path: Path) -> dict | None:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a foreign or damaged file (any unpickling error): rebuild it
        return None


def load_base_model(cfg: LocalConfig, device: torch.device, log: Callable[[str], None] = print) -> dict:
    """The cached base model's state dict (CPU tensors), training and caching it first if needed."""
    directory = cache_dir()
    path = directory / f"base-{base_key(cfg)}.pt"
    state = _try_load(path)
    if state is not None:
        return state
    directory.mkdir(parents=True, exist_ok=True)
    with _file_lock(path.with_suffix(".lock")):
        state = _try_load(path)  # another trial may have made it while we waited
        if state is not None:
            return state
        log(f"training the base model ({cfg.base_steps} warm-up steps) -> {path}")
        state = warmup(cfg, device, log)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
    return state
