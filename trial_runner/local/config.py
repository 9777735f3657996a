"""The local workload's config: a flat mapping of verl's key names, typed, with the reason beside each default.

``load_config(overrides)`` applies overrides to the defaults and validates them before any trial starts:
unknown keys, wrong types, out-of-range values and inconsistent batch arithmetic raise
``ConfigError`` naming the key and the rule (as verl's own ``validate_config`` does).
Keys under ``local.`` are this backend's own (the task, the model, the base-model warm-up); all other
keys are verl's and mean what they mean there, at this workload's scale.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from mart.state.search_space import ConfigError


def knob(key: str, default: Any, help: str, *, type: type | None = None, low: float | None = None,
         high: float | None = None, choices: tuple | None = None, nullable: bool = False) -> Any:
    meta = {"key": key, "help": help, "type": type or builtins_type(default), "low": low, "high": high,
            "choices": choices, "nullable": nullable}
    return field(default=default, metadata=meta)


def builtins_type(value: Any) -> type:
    return bool if isinstance(value, bool) else value.__class__


# fmt: off
@dataclass(frozen=True)
class LocalConfig:
    # --- data -----------------------------------------------------------------------------------------
    train_batch_size: int = knob("data.train_batch_size", 16, "Prompts per step; each is sampled rollout.n times (16 x 8 = 128 sequences per step).", low=1, high=1024)
    max_prompt_length: int = knob("data.max_prompt_length", 16, "Longest prompt in tokens; must hold the task's longest prompt (local.task.max_digits + 2).", low=3, high=256)
    max_response_length: int = knob("data.max_response_length", 16, "Generation cap in tokens; answers need up to max_digits + 1, so 16 leaves room to ramble (clip_ratio shows it).", low=1, high=256)
    # --- algorithm ------------------------------------------------------------------------------------
    adv_estimator: str = knob("algorithm.adv_estimator", "grpo", "Advantage estimator; the local workload implements GRPO only.", choices=("grpo",))
    norm_adv_by_std_in_grpo: bool = knob("algorithm.norm_adv_by_std_in_grpo", True, "Divide group-centred rewards by the group's std (GRPO); False = Dr. GRPO style centring only.")
    # --- rollout (generation, the vLLM stand-in) ------------------------------------------------------
    rollout_n: int = knob("actor_rollout_ref.rollout.n", 8, "Samples per prompt (the GRPO group size).", low=2, high=64)
    temperature: float = knob("actor_rollout_ref.rollout.temperature", 1.0, "Sampling temperature of rollouts; log-probs are computed at the same temperature (as verl).", low=0.01, high=5.0)
    top_p: float = knob("actor_rollout_ref.rollout.top_p", 1.0, "Nucleus sampling mass for rollouts (1 = off).", low=0.01, high=1.0)
    max_num_seqs: int = knob("actor_rollout_ref.rollout.max_num_seqs", 16, "Sequences generated together (one KV cache each): small = many sequential decode loops, large = more KV memory.", low=1, high=4096)
    rollout_log_prob_micro_batch_size_per_gpu: int | None = knob("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 8, "Sequences per forward when recomputing old log-probs (null only with use_dynamic_bsz).", type=int, low=1, high=4096, nullable=True)
    val_do_sample: bool = knob("actor_rollout_ref.rollout.val_kwargs.do_sample", False, "Sample during validation (False = greedy, verl's default).")
    val_temperature: float = knob("actor_rollout_ref.rollout.val_kwargs.temperature", 0.0, "Validation temperature when val_kwargs.do_sample is True.", low=0.0, high=5.0)
    # --- reference policy -----------------------------------------------------------------------------
    ref_log_prob_micro_batch_size_per_gpu: int | None = knob("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 8, "Sequences per forward of the frozen reference policy (used with use_kl_loss; null only with use_dynamic_bsz).", type=int, low=1, high=4096, nullable=True)
    # --- actor update ---------------------------------------------------------------------------------
    ppo_mini_batch_size: int = knob("actor_rollout_ref.actor.ppo_mini_batch_size", 8, "Prompts per optimizer step (x rollout.n sequences): 16 / 8 = 2 optimizer steps per step.", low=1, high=1024)
    ppo_micro_batch_size_per_gpu: int | None = knob("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 4, "Sequences per forward/backward, gradients accumulated over a mini-batch; conservative like verl's examples.", type=int, low=1, high=4096, nullable=True)
    use_dynamic_bsz: bool = knob("actor_rollout_ref.actor.use_dynamic_bsz", False, "Form micro-batches by token count (ppo_max_token_len_per_gpu) instead of a fixed size; also for the log-prob passes (verl's interpolated default).")
    ppo_max_token_len_per_gpu: int = knob("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 1024, "Token cap of a dynamic micro-batch (actual prompt + response tokens); must hold one longest sequence.", low=1, high=1_048_576)
    ppo_epochs: int = knob("actor_rollout_ref.actor.ppo_epochs", 1, "Passes over the rollout batch per step.", low=1, high=32)
    clip_ratio_low: float = knob("actor_rollout_ref.actor.clip_ratio_low", 0.2, "PPO clip below: ratio >= 1 - clip_ratio_low.", low=0.0, high=1.0)
    clip_ratio_high: float = knob("actor_rollout_ref.actor.clip_ratio_high", 0.2, "PPO clip above: ratio <= 1 + clip_ratio_high (DAPO raises it to 0.28).", low=0.0, high=10.0)
    clip_ratio_c: float = knob("actor_rollout_ref.actor.clip_ratio_c", 3.0, "Dual-clip bound for negative advantages (must be > 1).", low=1.0, high=100.0)
    loss_agg_mode: str = knob("actor_rollout_ref.actor.loss_agg_mode", "token-mean", "How token losses become one number.", choices=("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"))
    entropy_coeff: float = knob("actor_rollout_ref.actor.entropy_coeff", 0.0, "Entropy bonus weight (0 as in verl).", low=0.0, high=10.0)
    use_kl_loss: bool = knob("actor_rollout_ref.actor.use_kl_loss", True, "KL-to-reference loss (verl's GRPO examples turn it on; it adds the ref log-prob phase).")
    kl_loss_coef: float = knob("actor_rollout_ref.actor.kl_loss_coef", 0.001, "Weight of the KL loss.", low=0.0, high=100.0)
    kl_loss_type: str = knob("actor_rollout_ref.actor.kl_loss_type", "low_var_kl", "KL estimator: kl (k1), abs, mse (k2), low_var_kl (k3, clamped).", choices=("kl", "abs", "mse", "low_var_kl"))
    lr: float = knob("actor_rollout_ref.actor.optim.lr", 1e-4, "AdamW learning rate (a 0.6M-parameter model takes far larger steps than verl's 1e-6).", low=1e-9, high=1.0)
    weight_decay: float = knob("actor_rollout_ref.actor.optim.weight_decay", 0.01, "AdamW weight decay.", low=0.0, high=1.0)
    clip_grad: float = knob("actor_rollout_ref.actor.optim.clip_grad", 1.0, "Gradient-norm clip; a non-finite norm skips the update (as verl).", low=1e-6, high=1e6)
    lr_warmup_steps: int = knob("actor_rollout_ref.actor.optim.lr_warmup_steps", -1, "Warm-up optimizer steps; -1 = use lr_warmup_steps_ratio.", low=-1, high=1_000_000)
    lr_warmup_steps_ratio: float = knob("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", 0.0, "Warm-up as a share of all optimizer steps.", low=0.0, high=1.0)
    lr_scheduler_type: str = knob("actor_rollout_ref.actor.optim.lr_scheduler_type", "constant", "After warm-up: constant, or cosine down to min_lr_ratio x lr.", choices=("constant", "cosine"))
    min_lr_ratio: float = knob("actor_rollout_ref.actor.optim.min_lr_ratio", 0.0, "Floor of the cosine schedule, as a share of lr.", low=0.0, high=1.0)
    # --- model ----------------------------------------------------------------------------------------
    enable_gradient_checkpointing: bool = knob("actor_rollout_ref.model.enable_gradient_checkpointing", True, "Recompute each block's activations in backward: less memory, ~1/3 more update compute (on, as verl).")
    use_remove_padding: bool = knob("actor_rollout_ref.model.use_remove_padding", True, "Run each micro-batch only up to its longest sequence; False pads every sequence to max_prompt_length + max_response_length.")
    # --- trainer --------------------------------------------------------------------------------------
    total_training_steps: int = knob("trainer.total_training_steps", 30, "Steps of the trial (mart trial --steps sets it).", low=1, high=1_000_000)
    test_freq: int = knob("trainer.test_freq", 5, "Validate every this many steps and at the last step; -1 = only before training.", low=-1, high=1_000_000)
    val_before_train: bool = knob("trainer.val_before_train", True, "Write a step-0 validation record before training.")
    n_gpus_per_node: int = knob("trainer.n_gpus_per_node", 1, "The local backend emulates one device.", choices=(1,))
    nnodes: int = knob("trainer.nnodes", 1, "The local backend runs on one node.", choices=(1,))
    seed: int = knob("seed", 0, "Seeds the prompt order and the rollout sampling (the base model does not depend on it): same seed, same metrics, timings aside.", low=0, high=2**31 - 1)
    # --- local workload (not verl keys) ---------------------------------------------------------------
    task: str = knob("local.task.name", "digit_sort", "The embedded task: sort the digits of the prompt; digit_sort_long: the same from a base model that stops too early, where an answer cut at max_response_length scores 0, so answers lengthen as the policy learns and the limit binds.", choices=("digit_sort", "digit_sort_long"))
    min_digits: int = knob("local.task.min_digits", 3, "Shortest prompt in digits.", low=1, high=64)
    max_digits: int = knob("local.task.max_digits", 10, "Longest prompt in digits.", low=1, high=64)
    val_size: int = knob("local.task.val_size", 128, "Held-out validation prompts (greedy, one sample each: mean@1).", low=1, high=8192)
    n_layer: int = knob("local.model.n_layer", 3, "Transformer blocks.", low=1, high=48)
    n_head: int = knob("local.model.n_head", 4, "Attention heads.", low=1, high=64)
    n_embd: int = knob("local.model.n_embd", 128, "Width (0.6M parameters at the defaults).", low=8, high=4096)
    block_size: int = knob("local.model.block_size", 64, "Positions the model knows; max_prompt_length + max_response_length must fit.", low=8, high=4096)
    base_steps: int = knob("local.base_model.warmup_steps", 80, "Supervised warm-up steps of the base model (partial accuracy; cached on disk).", low=0, high=100_000)
    base_lr: float = knob("local.base_model.lr", 1e-3, "Learning rate of the warm-up.", low=1e-9, high=1.0)
    base_batch_size: int = knob("local.base_model.batch_size", 64, "Demonstrations per warm-up step.", low=1, high=4096)
    base_ramble_prob: float = knob("local.base_model.ramble_prob", 0.6, "Share of warm-up demonstrations that repeat their last digit before the end token: the base model's habit GRPO must unlearn (when to stop).", low=0.0, high=1.0)
    base_max_ramble: int = knob("local.base_model.max_ramble", 6, "Most extra repeats in such a demonstration.", low=0, high=64)
    base_peer_prob: float = knob("local.base_model.peer_prob", 0.0, "Share of warm-up prompts that carry 1-2 other (rough) answers after the task prompt, the multi-agent prompt format, so the base model can read it as a pretrained LLM reads a transcript; the demonstration still just sorts the task's digits. 0 = the single-agent base model.", low=0.0, high=1.0)
    num_threads: int = knob("local.num_threads", 0, "torch threads; 0 = $MART_NUM_THREADS, else 1: the matrices are small, a second thread gains little alone and collapses under CPU contention (parallel trials).", low=0, high=1024)
    throughput_clock: str = knob("local.throughput_clock", "auto", "What mart/compared_throughput, the figure stage 1 compares, is timed on: auto = the trainer thread's CPU time with one torch thread on the CPU (the same on an idle and a busy machine), else the wall clock; wall = the wall clock always. perf/throughput is wall-clock in either case (docs/backends.md).", choices=("auto", "wall"))
    device: str = knob("local.device", "cpu", "cpu (the default: the same workload and capacity on every machine), cuda, or auto = CUDA when present; one code path (scripts/gpu_check.sh runs it on CUDA).", choices=("auto", "cpu", "cuda"))
# fmt: on

FIELDS = {f.metadata["key"]: f for f in fields(LocalConfig)}
"""verl key -> dataclass field."""


def to_flat(cfg: LocalConfig) -> dict[str, Any]:
    """The full flat config (verl key -> value)."""
    return {key: getattr(cfg, f.name) for key, f in FIELDS.items()}


DEFAULTS: dict[str, Any] = to_flat(LocalConfig())


def _coerce(key: str, value: Any) -> Any:
    meta = FIELDS[key].metadata
    want: type = meta["type"]
    if value is None or (isinstance(value, str) and value.lower() in ("null", "none") and want is not str):
        if meta["nullable"]:
            return None
        raise ConfigError(f"`{key}` may not be null.")
    if want is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"`{key}` must be a bool (true/false), but got {value!r}.")
    if want is str:
        if not isinstance(value, str):
            raise ConfigError(f"`{key}` must be a string, but got {value!r}.")
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"`{key}` must be {'an integer' if want is int else 'a number'}, but got {value!r}.")
    elif not math.isfinite(value):
        raise ConfigError(f"`{key}` must be finite, but got {value!r}.")
    elif want is int:
        if value != int(value):
            raise ConfigError(f"`{key}` must be an integer, but got {value!r}.")
        value = int(value)
    else:
        value = float(value)
    if meta["choices"] is not None and value not in meta["choices"]:
        raise ConfigError(f"`{key}` must be one of {list(meta['choices'])}, but got {value!r}.")
    low, high = meta["low"], meta["high"]
    if low is not None and not low <= value <= high:
        raise ConfigError(f"`{key}` must lie in [{low}, {high}], but got {value!r}.")
    return value


# --- cross-key rules (verl's validate_config and ActorConfig checks, at this workload's scale) ---------

Rule = tuple[str, str, Callable[[LocalConfig], "str | None"]]


def _mini_ge_micro(c: LocalConfig) -> str | None:
    if c.use_dynamic_bsz:
        return None
    if c.ppo_micro_batch_size_per_gpu is None:
        return ("`actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu` must be set when "
                "`actor_rollout_ref.actor.use_dynamic_bsz` is False.")
    seqs = c.ppo_mini_batch_size * c.rollout_n
    if seqs % c.ppo_micro_batch_size_per_gpu:
        return (f"`actor_rollout_ref.actor.ppo_mini_batch_size` x `actor_rollout_ref.rollout.n` ({seqs}) must be "
                f"divisible by `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu` ({c.ppo_micro_batch_size_per_gpu}).")
    return None


def _train_ge_mini(c: LocalConfig) -> str | None:
    if c.train_batch_size < c.ppo_mini_batch_size:
        return (f"`data.train_batch_size` ({c.train_batch_size}) must be >= "
                f"`actor_rollout_ref.actor.ppo_mini_batch_size` ({c.ppo_mini_batch_size}).")
    if c.train_batch_size % c.ppo_mini_batch_size:
        return (f"`data.train_batch_size` ({c.train_batch_size}) must be divisible by "
                f"`actor_rollout_ref.actor.ppo_mini_batch_size` ({c.ppo_mini_batch_size}).")
    return None


def _log_prob_micro(c: LocalConfig) -> str | None:
    if c.use_dynamic_bsz:
        return None
    for key, v in (("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", c.rollout_log_prob_micro_batch_size_per_gpu),
                   ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", c.ref_log_prob_micro_batch_size_per_gpu)):
        if v is None:
            return f"`{key}` must be set when `actor_rollout_ref.actor.use_dynamic_bsz` is False."
    return None


def _token_cap(c: LocalConfig) -> str | None:
    longest = c.max_prompt_length + c.max_response_length
    if c.use_dynamic_bsz and c.ppo_max_token_len_per_gpu < longest:
        return (f"`actor_rollout_ref.actor.ppo_max_token_len_per_gpu` ({c.ppo_max_token_len_per_gpu}) must be >= "
                f"`data.max_prompt_length` + `data.max_response_length` ({longest}): one longest sequence must fit.")
    return None


def _lengths(c: LocalConfig) -> str | None:
    if c.min_digits > c.max_digits:
        return f"`local.task.min_digits` ({c.min_digits}) must be <= `local.task.max_digits` ({c.max_digits})."
    if c.max_prompt_length < c.max_digits + 2:
        return (f"`data.max_prompt_length` ({c.max_prompt_length}) must be >= `local.task.max_digits` + 2 "
                f"({c.max_digits + 2}): the task's longest prompt would be cut.")
    peer_demo = 3 * (c.max_digits + 2) + c.max_digits + c.base_max_ramble + 1  # prompt + 2 peers, longest demo
    if c.base_peer_prob > 0 and peer_demo > c.block_size:
        return (f"`local.base_model.peer_prob` > 0 needs `local.model.block_size` >= {peer_demo} (a task prompt with two "
                f"peer answers and the longest demonstration), but it is {c.block_size}.")
    if c.max_prompt_length + c.max_response_length > c.block_size:
        return (f"`data.max_prompt_length` + `data.max_response_length` ({c.max_prompt_length + c.max_response_length}) "
                f"must be <= `local.model.block_size` ({c.block_size}).")
    return None


def _model_shape(c: LocalConfig) -> str | None:
    if c.n_embd % c.n_head:
        return f"`local.model.n_embd` ({c.n_embd}) must be divisible by `local.model.n_head` ({c.n_head})."
    return None


def _sampling(c: LocalConfig) -> str | None:
    if c.val_do_sample and c.val_temperature <= 0:
        return ("`actor_rollout_ref.rollout.val_kwargs.temperature` must be > 0 when "
                "`actor_rollout_ref.rollout.val_kwargs.do_sample` is True.")
    if c.test_freq == 0:
        return "`trainer.test_freq` must be -1 (never) or >= 1."
    return None


RULES: list[Rule] = [
    ("train_batch_ge_mini_batch", "data.train_batch_size >= and divisible by actor.ppo_mini_batch_size", _train_ge_mini),
    ("mini_batch_divisible_by_micro", "without use_dynamic_bsz: ppo_micro_batch_size_per_gpu set and dividing ppo_mini_batch_size x rollout.n", _mini_ge_micro),
    ("log_prob_micro_batch_set", "without use_dynamic_bsz: rollout/ref log_prob_micro_batch_size_per_gpu set", _log_prob_micro),
    ("dynamic_bsz_token_cap", "with use_dynamic_bsz: ppo_max_token_len_per_gpu >= max_prompt_length + max_response_length", _token_cap),
    ("lengths_fit", "task prompts fit max_prompt_length; prompt + response fit local.model.block_size", _lengths),
    ("model_shape", "local.model.n_embd divisible by local.model.n_head", _model_shape),
    ("sampling", "val_kwargs.do_sample needs val_kwargs.temperature > 0; test_freq is -1 or >= 1", _sampling),
]


def _suggest(key: str) -> str:
    close = difflib.get_close_matches(key, list(FIELDS), n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def parse_overrides(overrides: Mapping[str, Any]) -> tuple[LocalConfig | None, list[str]]:
    """Defaults + ``overrides`` with each key and value checked (not the cross-key rules)."""
    errors: list[str] = []
    values: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in FIELDS:
            errors.append(f"unknown key `{key}` for the local backend{_suggest(key)}; see docs/backends.md.")
            continue
        try:
            values[FIELDS[key].name] = _coerce(key, value)
        except ConfigError as e:
            errors.append(str(e))
    return (None, errors) if errors else (replace(LocalConfig(), **values), [])


def rule_errors(cfg: LocalConfig) -> list[str]:
    """Messages of every cross-key rule ``cfg`` breaks, each naming its rule."""
    return [f"{msg} [rule {name}]" for name, _, check in RULES if (msg := check(cfg))]


def config_errors(overrides: Mapping[str, Any]) -> tuple[LocalConfig | None, list[str]]:
    """Apply ``overrides`` to the defaults; the config (None if invalid) and every error."""
    cfg, errors = parse_overrides(overrides)
    if cfg is not None:
        errors = rule_errors(cfg)
    return (None if errors else cfg), errors


def load_config(overrides: Mapping[str, Any] | None = None) -> LocalConfig:
    """Defaults + ``overrides`` (flat verl keys), validated.

    Raises:
        ConfigError: naming each bad key and the rule it breaks (one per line).
    """
    cfg, errors = config_errors(overrides or {})
    if errors:
        raise ConfigError("\n".join(errors))
    assert cfg is not None
    return cfg


def resolve_threads(cfg: LocalConfig) -> int:
    if cfg.num_threads > 0:
        return cfg.num_threads
    env = os.environ.get("MART_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return 1


def describe_keys() -> str:
    """Markdown table of every key: default, allowed values and meaning (docs/backends.md's table)."""
    rows = ["| key | default | allowed | meaning |", "|---|---|---|---|"]
    for key, f in FIELDS.items():
        m = f.metadata
        if m["choices"] is not None:
            allowed = " / ".join(_fmt(c) for c in m["choices"])
        elif m["type"] is bool:
            allowed = "bool"
        else:
            allowed = f"{m['type'].__name__} in [{_fmt(m['low'])}, {_fmt(m['high'])}]"
        if m["nullable"]:
            allowed += ", null"
        rows.append(f"| `{key}` | `{_fmt(f.default)}` | {allowed} | {m['help']} |")
    return "\n".join(rows)


def _fmt(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


#: A workload small enough for tests, soaks and quick benchmarks (a 2-layer, 64-wide model sorting 3-6
#: digits): its base model trains in a few seconds, a step takes ~0.1 s, and GRPO still visibly learns.
TINY_CONFIG: dict[str, Any] = {
    "local.model.n_layer": 2,
    "local.model.n_embd": 64,
    "local.model.n_head": 4,
    "local.model.block_size": 24,
    "local.task.min_digits": 3,
    "local.task.max_digits": 6,
    "local.task.val_size": 64,
    "local.base_model.warmup_steps": 100,
    "local.base_model.lr": 3e-3,
    "data.max_prompt_length": 8,
    "data.max_response_length": 12,
    "data.train_batch_size": 8,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 32,
    "actor_rollout_ref.actor.optim.lr": 3e-4,
    "actor_rollout_ref.rollout.max_num_seqs": 64,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 64,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 64,
    "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    "trainer.test_freq": 5,
}
