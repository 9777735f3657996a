"""The verl (0.9) search-space catalogue: the knobs mart tunes, verl's defaults, and its config rules.

Keys are verl's full flat Hydra keys (``actor_rollout_ref.rollout.n``). Defaults are verl 0.9's
(``verl/trainer/config/_generated_ppo_trainer.yaml``), except the three micro batch sizes, whose verl
default is ``null`` although verl refuses to run without one when dynamic batch sizing is off: those take
the values of verl's GRPO example scripts (16 for the actor's update, 32 for the forward-only log-prob
passes, which verl's perf guide puts at ~2x the training micro batch).

Constraints mirror verl's ``validate_config`` / ``ActorConfig`` checks plus the runtime rules that verl
only finds after launch (``validate_config`` in verl's ``verl/utils/config.py``, ``ActorConfig`` in
``verl/workers/config/actor.py``; github.com/verl-project/verl at v0.9.1). Each reads the full flat
config with verl's *true* defaults for absent keys (``VERL_DEFAULTS``), so a partial config is judged the
way verl would judge it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mart.state.search_space import Constraint, KnobEffect, ParamSpec, SearchSpace
from mart.state.verl_keys import ARR

ACTOR = f"{ARR}.actor"
ROLLOUT = f"{ARR}.rollout"
REF = f"{ARR}.ref"
MODEL = f"{ARR}.model"

#: verl 0.9's own defaults for every key the constraints read (null micro batch sizes included).
VERL_DEFAULTS: dict[str, Any] = {
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
    "algorithm.adv_estimator": "gae",
    "algorithm.use_kl_in_reward": False,
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    f"{ACTOR}.use_dynamic_bsz": False,
    f"{ACTOR}.ppo_mini_batch_size": 256,
    f"{ACTOR}.ppo_micro_batch_size": None,
    f"{ACTOR}.ppo_micro_batch_size_per_gpu": None,
    f"{ACTOR}.ppo_max_token_len_per_gpu": 16384,
    f"{ACTOR}.ulysses_sequence_parallel_size": 1,
    f"{ACTOR}.use_kl_loss": False,
    f"{ROLLOUT}.n": 1,
    f"{ROLLOUT}.temperature": 1.0,
    f"{ROLLOUT}.val_kwargs.do_sample": False,
    f"{ROLLOUT}.tensor_model_parallel_size": 2,
    f"{ROLLOUT}.data_parallel_size": 1,
    f"{ROLLOUT}.pipeline_model_parallel_size": 1,
    f"{ROLLOUT}.log_prob_micro_batch_size": None,
    f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu": None,
    f"{ROLLOUT}.max_num_batched_tokens": 8192,
    f"{ROLLOUT}.enable_chunked_prefill": True,
    f"{REF}.log_prob_micro_batch_size": None,
    f"{REF}.log_prob_micro_batch_size_per_gpu": None,
    f"{MODEL}.use_remove_padding": True,
}

_P = ParamSpec

SYSTEM_PARAMS: list[ParamSpec] = [
    _P(f"{ROLLOUT}.gpu_memory_utilization", "system", "float", 0.5,
       "Share of each GPU's memory vLLM may take (weights + KV cache) during rollout. Higher = more KV cache, "
       "more concurrent sequences, faster generation; too high leaves no room for the actor's training memory "
       "when colocated. The first knob in verl's perf guide; small models waste the GPU at 0.5.",
       low=0.2, high=0.95,
       model="util", effect=KnobEffect("up", 0.6, note="more KV cache, more concurrency",
                                       note_against="less KV cache and concurrency, more memory left for the update"),
       phases=("gen", "update_weights"),
       aliases=("memory share", "memory utilization", "gpu memory utilization", "kv cache share", "gmu")),
    _P(f"{ROLLOUT}.tensor_model_parallel_size", "system", "categorical", 2,
       "vLLM tensor parallel degree of the rollout engine. Smaller TP = more independent engines (data "
       "parallel replicas), usually faster when the model and its KV cache fit; must divide the GPU count.",
       choices=(1, 2, 4, 8),
       model="tp", effect=KnobEffect("down", -0.2, note="less TP communication for small models",
                                     note_against="more TP communication, more KV cache per GPU"),
       phases=("gen", "update_weights"),
       aliases=("tp", "tensor parallel", "tensor parallelism", "rollout tp")),
    _P(f"{ROLLOUT}.max_num_seqs", "system", "int", 256,
       "vLLM's cap on sequences batched together in one engine step. Raise with a large KV cache; bounded "
       "by KV memory.", low=16, high=2048,
       model="mns", effect=KnobEffect("up", 0.15, note="more sequences decoded concurrently",
                                      note_against="fewer sequences decoded concurrently"),
       aliases=("concurrency", "num seqs", "concurrent sequences")),
    _P(f"{ROLLOUT}.max_num_batched_tokens", "system", "int", 8192,
       "vLLM's cap on tokens per engine step (prefill chunking). Higher = faster prefill, more activation "
       "memory. Must be >= prompt+response length when chunked prefill is off.", low=1024, high=131072,
       model="mnbt", effect=KnobEffect("up", 0.1, note="larger prefill/decode batches",
                                       note_against="smaller prefill/decode batches"), schedule=True),
    _P(f"{ROLLOUT}.enable_chunked_prefill", "system", "bool", True,
       "vLLM chunked prefill: splits long prefills so decode is not stalled.",
       model="chunked", effect=KnobEffect(True)),
    _P(f"{ROLLOUT}.enable_prefix_caching", "system", "bool", True,
       "vLLM prefix caching: the n samples of a prompt share its prefill KV cache.",
       model="prefix"),
    _P(f"{ROLLOUT}.enforce_eager", "system", "bool", False,
       "Disable CUDA graphs in vLLM (saves memory and capture time, slows decode).",
       model="eager", effect=KnobEffect(False, 0.0, 0.97, note="CUDA graphs speed up decode",
                                        note_against="no CUDA graphs: slower decode, less memory")),
    _P(f"{ROLLOUT}.free_cache_engine", "system", "bool", True,
       "Release vLLM's KV cache after rollout so the actor's update can use the memory (colocated mode).",
       model="free_cache", phases=("gen", "update_weights")),
    _P(f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", "system", "int", 32,
       "Micro batch (sequences per GPU) of the old-policy log-prob forward pass. verl's default is null but "
       "one must be set without dynamic bsz; 32 as in verl's GRPO examples (forward-only ~2x the training "
       "micro batch). Ignored with use_dynamic_bsz.", low=1, high=256,
       model="lp_micro", effect=KnobEffect("up", 0.2, note="fewer, larger forward passes",
                                           note_against="more, smaller forward passes: less activation memory"),
       aliases=("log prob micro batch", "log-prob micro batch"), memory_safe=True),
    _P(f"{REF}.log_prob_micro_batch_size_per_gpu", "system", "int", 32,
       "Micro batch of the reference policy's log-prob forward pass (only with a KL term). verl's default "
       "is null but one must be set; 32 as in verl's GRPO examples. Ignored with use_dynamic_bsz.",
       low=1, high=256,
       model="ref_micro", effect=KnobEffect("up", 0.2, note="fewer, larger forward passes",
                                            note_against="more, smaller forward passes: less activation memory"),
       aliases=("ref micro batch", "ref log prob micro batch"), memory_safe=True),
    _P(f"{ACTOR}.ppo_micro_batch_size_per_gpu", "system", "int", 16,
       "Micro batch (sequences per GPU) of the actor's training forward/backward; gradients accumulate up to "
       "the mini batch. Larger = faster, more activation memory. verl's default is null but one must be set "
       "without dynamic bsz; 16 as in verl's GRPO examples.", low=1, high=256,
       model="ppo_micro", effect=KnobEffect("up", 0.3, note="fewer, larger backward passes",
                                            note_against="more, smaller backward passes: less activation memory"),
       aliases=("micro batch", "micro-batch", "micro batch size", "micro batches"), memory_safe=True),
    _P(f"{ACTOR}.use_dynamic_bsz", "system", "bool", False,
       "Pack micro batches by token count (ppo_max_token_len_per_gpu) instead of sequence count; usually "
       "faster for variable-length responses. Also applies to the log-prob passes.",
       model="dyn", effect=KnobEffect(True, 0.0, 1.05, note="packs micro batches by tokens",
                                      note_against="micro batches by sequence count, not packed by tokens"),
       phases=("update_actor", "old_log_prob", "ref"),
       aliases=("dynamic batch", "dynamic batching", "dynamic bsz")),
    _P(f"{ACTOR}.ppo_max_token_len_per_gpu", "system", "int", 16384,
       "Token budget per GPU micro batch with dynamic bsz; verl advises >= 2-3 x (prompt + response) and it "
       "must hold the longest sequence, or the run crashes mid-training when responses grow.",
       low=1024, high=262144,
       model="tok_cap", effect=KnobEffect("up", 0.3, note="larger token-balanced micro batches",
                                          note_against="smaller token-balanced micro batches: less activation memory"), schedule=True,
       phases=("update_actor", "old_log_prob", "ref")),
    _P(f"{ACTOR}.ulysses_sequence_parallel_size", "system", "categorical", 1,
       "Ulysses sequence parallelism for the actor/ref (long contexts, > 32k). Needs use_remove_padding.",
       choices=(1, 2, 4, 8),
       model="sp", phases=("update_actor", "old_log_prob", "ref")),
    _P(f"{ACTOR}.strategy", "system", "categorical", "fsdp",
       "Training engine: FSDP (default) or FSDP2 (opt-in; often less memory and faster).",
       choices=("fsdp", "fsdp2"),
       model="fsdp2", phases=("update_actor", "old_log_prob", "ref")),
    _P(f"{ACTOR}.fsdp_config.param_offload", "system", "bool", False,
       "Offload the actor's parameters to CPU between uses: saves GPU memory, costs transfer time.",
       model="param_off", effect=KnobEffect(False, 0.0, 0.8, note="no host transfers of the offloaded state",
                                            note_against="offload saves GPU memory, at the cost of host transfers"),
       phases=("update_actor", "old_log_prob", "update_weights"),
       aliases=("param offload", "parameter offload", "actor offload")),
    _P(f"{ACTOR}.fsdp_config.optimizer_offload", "system", "bool", False,
       "Offload the actor's optimizer state to CPU: large memory saving (Adam = 2x params), slower update.",
       model="opt_off", effect=KnobEffect(False, 0.0, 0.75, note="no host transfers of the offloaded state",
                                          note_against="offload saves GPU memory, at the cost of host transfers"),
       aliases=("optimizer offload",)),
    _P(f"{REF}.fsdp_config.param_offload", "system", "bool", False,
       "Offload the reference model's parameters to CPU (verl's GRPO example turns it on).",
       model="ref_off", effect=KnobEffect(False, 0.0, 0.9, note="no host transfers of the offloaded state",
                                          note_against="offload saves GPU memory, at the cost of host transfers"),
       aliases=("ref offload", "reference offload")),
    _P(f"{MODEL}.enable_gradient_checkpointing", "system", "bool", True,
       "Recompute activations in backward: much less activation memory, ~30% more update compute.",
       model="ckpt", effect=KnobEffect(False, 0.0, 0.7, note="no recompute in the backward pass, more activation memory",
                                       note_against="recompute saves activation memory, at ~30% more update compute"),
       aliases=("checkpointing", "activation checkpointing", "recompute")),
    _P(f"{MODEL}.enable_activation_offload", "system", "bool", False,
       "Offload activations to CPU during the actor update.",
       model="act_off"),
    _P(f"{MODEL}.use_remove_padding", "system", "bool", True,
       "Remove padding tokens (packed sequences) in actor/ref forward passes; required by Ulysses SP.",
       model="remove_pad", effect=KnobEffect(True, 0.0, 0.9, note="no compute on padding",
                                             note_against="compute spent on padding tokens"),
       phases=("update_actor", "old_log_prob", "ref")),
    _P(f"{ACTOR}.entropy_from_logits_with_chunking", "system", "bool", False,
       "Compute the entropy from logits in chunks (less peak memory for large vocabularies).",
       model="ent_chunk", phases=("update_actor", "old_log_prob")),
    _P(f"{ACTOR}.entropy_checkpointing", "system", "bool", False,
       "Recompute the entropy in backward instead of storing it (less memory).",
       model="ent_ckpt"),
    _P("trainer.balance_batch", "system", "bool", True,
       "Reorder samples so every data-parallel rank gets a similar token count."),
]

LEARNING_PARAMS: list[ParamSpec] = [
    _P(f"{ACTOR}.optim.lr", "learning", "log", 1e-6,
       "Actor learning rate (AdamW). GRPO on LLMs uses ~1e-7..1e-5; too high collapses entropy.",
       low=1e-8, high=1e-4,
       prior="lr", aliases=("learning rate",)),
    _P(f"{ACTOR}.optim.lr_warmup_steps_ratio", "learning", "float", 0.0,
       "Share of the total steps spent warming the learning rate up.", low=0.0, high=0.3),
    _P(f"{ACTOR}.optim.weight_decay", "learning", "float", 0.01,
       "AdamW weight decay of the actor.", low=0.0, high=0.2),
    _P(f"{ACTOR}.optim.clip_grad", "learning", "float", 1.0,
       "Gradient norm clipping threshold of the actor.", low=0.1, high=10.0),
    _P(f"{ACTOR}.use_kl_loss", "learning", "bool", False,
       "Add a KL(policy || reference) loss term (needs the reference model: more memory and a ref pass).",
       prior="kl"),
    _P(f"{ACTOR}.kl_loss_coef", "learning", "log", 0.001,
       "Weight of the KL loss term (only with use_kl_loss).", low=1e-5, high=1.0,
       prior="kl", aliases=("kl coef", "kl coefficient", "kl weight")),
    _P(f"{ACTOR}.kl_loss_type", "learning", "categorical", "low_var_kl",
       "KL estimator of the KL loss: low_var_kl (k3), kl (k1), mse (k2), abs.",
       choices=("low_var_kl", "kl", "mse", "abs"),
       prior="kl"),
    _P(f"{ACTOR}.entropy_coeff", "learning", "float", 0.0,
       "Entropy bonus weight; > 0 counters entropy collapse, too high destabilises.", low=0.0, high=0.01,
       prior="entropy", aliases=("entropy bonus", "entropy coefficient")),
    _P(f"{ACTOR}.clip_ratio_low", "learning", "float", 0.2,
       "PPO clip range below 1 (ratio >= 1 - low).", low=0.05, high=0.4,
       prior="clip_low"),
    _P(f"{ACTOR}.clip_ratio_high", "learning", "float", 0.2,
       "PPO clip range above 1 (ratio <= 1 + high); DAPO's clip-higher uses ~0.28 to keep exploring.",
       low=0.05, high=0.5,
       prior="clip_high", aliases=("clip higher", "clip-higher", "upper clip", "clip high")),
    _P(f"{ACTOR}.loss_agg_mode", "learning", "categorical", "token-mean",
       "How token losses are aggregated (verl's valid modes).",
       choices=("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")),
    _P(f"{ACTOR}.ppo_epochs", "learning", "int", 1,
       "Passes over each batch of rollouts; optimizer steps per global step = train/mini x epochs.",
       low=1, high=4),
    _P(f"{ACTOR}.ppo_mini_batch_size", "learning", "int", 256,
       "Prompts per optimizer step (x rollout.n samples internally); smaller = more updates per step, "
       "more off-policy. Must not exceed data.train_batch_size.", low=4, high=4096),
    _P(f"{ROLLOUT}.n", "learning", "int", 1,
       "Samples per prompt (GRPO's group size; GRPO needs >= 2, verl's example uses 5). Multiplies rollout "
       "and update work.", low=1, high=64,
       prior="rollout_n", effect=KnobEffect("down", 0.3, phase="all"),
       aliases=("rollouts per prompt", "group size", "samples per prompt")),
    _P(f"{ROLLOUT}.temperature", "learning", "float", 1.0,
       "Sampling temperature of rollouts (exploration).", low=0.1, high=1.5,
       prior="temperature"),
    _P(f"{ROLLOUT}.top_p", "learning", "float", 1.0,
       "Nucleus sampling threshold of rollouts.", low=0.1, high=1.0),
    _P("data.train_batch_size", "learning", "int", 1024,
       "Prompts per training step.", low=8, high=8192),
    _P("data.max_response_length", "learning", "int", 512,
       "Longest generated response (tokens); responses hitting it are truncated (watch "
       "response_length/clip_ratio). More memory and time per step.", low=64, high=65536,
       aliases=("response length", "length budget", "max length", "response budget")),
    _P("algorithm.norm_adv_by_std_in_grpo", "learning", "bool", True,
       "Divide GRPO advantages by the group's reward std (False = Dr. GRPO's unbiased variant)."),
]


def cfg_get(config: dict[str, Any], key: str) -> Any:
    """``config[key]``, else verl's own default for that key (None when mart does not know it)."""
    return config.get(key, VERL_DEFAULTS.get(key))


def _n_gpus(c: dict[str, Any]) -> int:
    return int(cfg_get(c, "trainer.n_gpus_per_node")) * int(cfg_get(c, "trainer.nnodes"))


def _dyn(c: dict[str, Any]) -> bool:
    return bool(cfg_get(c, f"{ACTOR}.use_dynamic_bsz"))


def _uses_ref(c: dict[str, Any]) -> bool:
    return bool(cfg_get(c, f"{ACTOR}.use_kl_loss")) or bool(cfg_get(c, "algorithm.use_kl_in_reward"))


def _check_batch_divisible(c: dict[str, Any]) -> str | None:
    if _dyn(c):
        return None
    real = int(cfg_get(c, "data.train_batch_size")) * int(cfg_get(c, f"{ROLLOUT}.n"))
    n = _n_gpus(c)
    if n > 0 and real % n:
        return (f"data.train_batch_size x rollout.n ({real}) must be divisible by the GPU count "
                f"trainer.n_gpus_per_node x trainer.nnodes ({n}) without dynamic bsz.")
    return None


def _exactly_one(c: dict[str, Any], section: str, param: str) -> str | None:
    mbs, per_gpu = cfg_get(c, f"{section}.{param}"), cfg_get(c, f"{section}.{param}_per_gpu")
    if mbs is None and per_gpu is None:
        return f"set {section}.{param}_per_gpu (verl needs a micro batch size without dynamic bsz)."
    if mbs is not None and per_gpu is not None:
        return f"set only {section}.{param}_per_gpu, not also the deprecated {section}.{param}."
    return None


def _check_micro_batches(c: dict[str, Any]) -> str | None:
    if _dyn(c):
        return None
    msgs = [_exactly_one(c, ACTOR, "ppo_micro_batch_size"), _exactly_one(c, ROLLOUT, "log_prob_micro_batch_size")]
    if _uses_ref(c):
        msgs.append(_exactly_one(c, REF, "log_prob_micro_batch_size"))
    msgs = [m for m in msgs if m]
    return " ".join(msgs) if msgs else None


def _check_mini_le_train(c: dict[str, Any]) -> str | None:
    train, mini = int(cfg_get(c, "data.train_batch_size")), int(cfg_get(c, f"{ACTOR}.ppo_mini_batch_size"))
    if train < mini:
        return f"data.train_batch_size ({train}) must be >= actor.ppo_mini_batch_size ({mini})."
    return None


def _actor_dp(c: dict[str, Any]) -> int:
    sp = int(cfg_get(c, f"{ACTOR}.ulysses_sequence_parallel_size") or 1)
    return max(1, _n_gpus(c) // max(1, sp))


def _check_mini_dp(c: dict[str, Any]) -> str | None:
    mini = int(cfg_get(c, f"{ACTOR}.ppo_mini_batch_size")) * int(cfg_get(c, f"{ROLLOUT}.n"))
    dp = _actor_dp(c)
    if mini % dp:
        return (f"actor.ppo_mini_batch_size x rollout.n ({mini}) must be divisible by the actor's data-parallel "
                f"size ({dp} = GPUs / ulysses_sequence_parallel_size); verl fails at startup otherwise.")
    return None


def _check_micro_divides_mini(c: dict[str, Any]) -> str | None:
    if _dyn(c):
        return None
    micro = cfg_get(c, f"{ACTOR}.ppo_micro_batch_size_per_gpu")
    if micro is None:
        return None
    per_gpu_mini = int(cfg_get(c, f"{ACTOR}.ppo_mini_batch_size")) * int(cfg_get(c, f"{ROLLOUT}.n")) // _actor_dp(c)
    if per_gpu_mini < 1 or per_gpu_mini % int(micro):
        return (f"the per-GPU mini batch (ppo_mini_batch_size x n / dp = {per_gpu_mini}) must be a positive "
                f"multiple of actor.ppo_micro_batch_size_per_gpu ({micro}).")
    return None


def _check_rollout_tp(c: dict[str, Any]) -> str | None:
    tp = int(cfg_get(c, f"{ROLLOUT}.tensor_model_parallel_size"))
    size = tp * int(cfg_get(c, f"{ROLLOUT}.data_parallel_size")) * int(cfg_get(c, f"{ROLLOUT}.pipeline_model_parallel_size"))
    n = _n_gpus(c)
    if size <= 0 or n % size:
        return (f"the GPU count ({n}) must be divisible by rollout TP x DP x PP ({size}); "
                f"rollout.tensor_model_parallel_size={tp}.")
    if tp > int(cfg_get(c, "trainer.n_gpus_per_node")):
        return f"rollout.tensor_model_parallel_size ({tp}) must not exceed trainer.n_gpus_per_node."
    return None


def _check_sp_remove_padding(c: dict[str, Any]) -> str | None:
    sp = int(cfg_get(c, f"{ACTOR}.ulysses_sequence_parallel_size") or 1)
    if sp > 1 and not cfg_get(c, f"{MODEL}.use_remove_padding"):
        return "actor.ulysses_sequence_parallel_size > 1 needs model.use_remove_padding=True."
    return None


def _check_val_sampling(c: dict[str, Any]) -> str | None:
    if cfg_get(c, f"{ROLLOUT}.val_kwargs.do_sample") and not float(cfg_get(c, f"{ROLLOUT}.temperature")) > 0:
        return "rollout.val_kwargs.do_sample needs rollout.temperature > 0."
    return None


def _seq_len(c: dict[str, Any]) -> int:
    return int(cfg_get(c, "data.max_prompt_length")) + int(cfg_get(c, "data.max_response_length"))


def _check_dyn_token_cap(c: dict[str, Any]) -> str | None:
    if not _dyn(c):
        return None
    cap = int(cfg_get(c, f"{ACTOR}.ppo_max_token_len_per_gpu"))
    sp = int(cfg_get(c, f"{ACTOR}.ulysses_sequence_parallel_size") or 1)
    if cap * sp < _seq_len(c):
        return (f"with dynamic bsz, actor.ppo_max_token_len_per_gpu x SP ({cap * sp}) must hold the longest "
                f"sequence (max_prompt_length + max_response_length = {_seq_len(c)}); the run would crash once "
                f"responses grow.")
    return None


def _check_batched_tokens(c: dict[str, Any]) -> str | None:
    if cfg_get(c, f"{ROLLOUT}.enable_chunked_prefill"):
        return None
    tokens = int(cfg_get(c, f"{ROLLOUT}.max_num_batched_tokens"))
    if tokens < _seq_len(c):
        return (f"without chunked prefill, rollout.max_num_batched_tokens ({tokens}) must be >= the model length "
                f"(max_prompt_length + max_response_length = {_seq_len(c)}); vLLM refuses to start.")
    return None


def _check_grpo_group(c: dict[str, Any]) -> str | None:
    if str(cfg_get(c, "algorithm.adv_estimator")) == "grpo" and int(cfg_get(c, f"{ROLLOUT}.n")) < 2:
        return "GRPO needs rollout.n >= 2 (a group of samples per prompt); with n=1 every advantage is 0."
    return None


def _check_reference_on_cpu(c: dict[str, Any]) -> str | None:
    # verl 0.9.1's forward-only FSDP2 engine (the reference model) shards its parameters under
    # CPUOffloadPolicy(pin_memory=True), and pinned memory needs an accelerator: on trainer.device=cpu the
    # reference worker fails at start ("Cannot access accelerator device when none is available")
    if str(cfg_get(c, "trainer.device")).lower() == "cpu" and _uses_ref(c):
        return ("a KL loss or KL-in-reward needs verl's reference model, which cannot start with trainer.device=cpu "
                "(its FSDP2 offload pins memory, which needs an accelerator).")
    return None


def _constraint(name: str, description: str, check: Callable[[dict[str, Any]], str | None]) -> Constraint:
    def safe(config: dict[str, Any]) -> str | None:
        try:
            return check(config)
        except (TypeError, ValueError) as e:  # a non-numeric value in a numeric key
            return f"cannot check ({e})."

    return Constraint(name, description, safe)


CONSTRAINTS: list[Constraint] = [
    _constraint("batch_divisible_by_gpus",
                "verl validate_config: without dynamic bsz, train_batch_size x rollout.n % (n_gpus_per_node x nnodes) == 0.",
                _check_batch_divisible),
    _constraint("micro_batch_sizes_set",
                "verl validate_config: without dynamic bsz, exactly one micro batch size is set for actor, rollout "
                "log-prob and (with a KL term) ref log-prob.",
                _check_micro_batches),
    _constraint("mini_batch_le_train_batch",
                "verl ActorConfig: data.train_batch_size >= actor.ppo_mini_batch_size.", _check_mini_le_train),
    _constraint("mini_batch_divisible_by_dp",
                "verl runtime: ppo_mini_batch_size x rollout.n divisible by the actor's data-parallel size.",
                _check_mini_dp),
    _constraint("micro_divides_mini",
                "verl runtime: the per-GPU mini batch is a multiple of ppo_micro_batch_size_per_gpu.",
                _check_micro_divides_mini),
    _constraint("rollout_parallel_divides_gpus",
                "verl runtime: world size % (rollout TP x DP x PP) == 0 and TP <= GPUs per node.", _check_rollout_tp),
    _constraint("sp_needs_remove_padding",
                "verl ActorConfig: Ulysses SP > 1 needs model.use_remove_padding.", _check_sp_remove_padding),
    _constraint("val_sampling_temperature",
                "verl validate_config: rollout.val_kwargs.do_sample needs temperature > 0.", _check_val_sampling),
    _constraint("dynamic_bsz_token_cap",
                "verl runtime: with dynamic bsz, ppo_max_token_len_per_gpu x SP >= prompt + response length.",
                _check_dyn_token_cap),
    _constraint("batched_tokens_without_chunked_prefill",
                "vLLM: without chunked prefill, max_num_batched_tokens >= prompt + response length.",
                _check_batched_tokens),
    _constraint("grpo_group_size",
                "GRPO (algorithm.adv_estimator=grpo) needs rollout.n >= 2.", _check_grpo_group),
    _constraint("reference_model_needs_an_accelerator",
                "verl's reference model (KL loss or KL in reward) does not start with trainer.device=cpu.",
                _check_reference_on_cpu),
]

SEARCH_SPACE = SearchSpace(backend="verl", params=SYSTEM_PARAMS + LEARNING_PARAMS, constraints=CONSTRAINTS)

__all__ = ["CONSTRAINTS", "SEARCH_SPACE", "VERL_DEFAULTS", "cfg_get"]
