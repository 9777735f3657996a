"""The MARTI search-space catalogue: the knobs mart tunes on MARTI's multi-agent trainer, and MARTI's rules.

Facts from github.com/TsinghuaC3I/MARTI at commit ``_flags.MARTI_COMMIT`` (``marti/cli/multi_agent_train_ppo_ray.py``,
``marti/trainer/``, ``marti/verifiers/auto_reward_alloc.py``, ``examples/multi-agent/run_train_mad.sh``).

A mart config is flat. Its keys are

* MARTI's own flag names (``actor_learning_rate``, ``vllm_num_engines``, ...): one ``--flag`` each;
* ``agents.<i>.<key>``: agent ``i``'s JSON object of ``--agents`` (MARTI reads the JSON key as the agent id);
* ``default_agent.<key>``, ``workflow_args.<key>``, ``reward_alloc.<key>``, ``tools_config.<key>``: the JSON
  objects of those flags;
* ``async_num_tasks``: the environment variable ``OPENRLHF_ASYNC_NUM_TASKS`` (rollout workers of a workflow).

How MARTI resolves an agent's value (the CLI's post-parse loop): the agent's own JSON key, else
``--default_agent``'s, else the global flag. Which per-agent keys it then *honours* matters: at this commit the
actor's optimizer, loss and KL controller read the global ``strategy.args`` (``actor_learning_rate``,
``init_kl_coef``, ``micro_train_batch_size``, ...), so those are shared knobs here; per agent it honours the
resource layout (``actor_num_*``, ``ref_num_*``, ``vllm_*``, ``colocate_all_models``, ...), sampling
(``temperature``, ``top_p``, ``generate_max_len``, ...) and paths. Per-agent knobs are nullable: ``None``
leaves the key out of the agent's JSON, so the shared knob holds for that agent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mart.state.agents import ASYNC_TASKS, NUM_ROUNDS
from mart.state.search_space import Constraint, ParamSpec, SearchSpace
from mart.trial_runner.marti._flags import FLAGS

#: JSON-valued flags a config spells as ``<flag>.<key>`` (``agents`` as ``agents.<i>.<key>``).
JSON_FLAGS = ("agents", "default_agent", "workflow_args", "reward_alloc", "tools_config")
#: the config key that becomes ``OPENRLHF_ASYNC_NUM_TASKS`` (MARTI's workflow wrapper reads it; default 128).
ASYNC_KEY = "async_num_tasks"
ASYNC_ENV = "OPENRLHF_ASYNC_NUM_TASKS"
MARTI_ASYNC_DEFAULT = 128

#: per-agent keys MARTI reads from an agent's own config (``init_agent``, ``Agent``, the trainer) at this commit.
AGENT_KEYS = frozenset({
    "role", "pretrain", "save_path", "ckpt_path", "is_tuning", "is_reasoning_model", "disable_fast_tokenizer",
    "max_len", "prompt_max_len", "generate_max_len", "eval_generate_max_len", "temperature", "eval_temperature",
    "top_p", "top_k", "vllm_num_engines", "vllm_tensor_parallel_size", "vllm_gpu_memory_utilization",
    "vllm_enable_sleep", "colocate_all_models", "colocate_actor_ref", "colocate_critic_reward", "full_determinism",
    "enable_prefix_caching", "enforce_eager", "agent_func_path", "actor_num_nodes", "actor_num_gpus_per_node",
    "ref_num_nodes", "ref_num_gpus_per_node", "critic_num_nodes", "critic_num_gpus_per_node", "reward_num_nodes",
    "reward_num_gpus_per_node", "critic_pretrain", "reward_pretrain", "save_value_network",
})
# Not here on purpose: keys the CLI only *checks* per agent (advantage_estimator, n_samples_per_prompt,
# packing_samples, use_kl_loss, ...) while training reads the global flag: per agent they would mislead.

#: reward shaping modes of ``MultiAgentRewardAllocation._reward_shaping`` (None: no shaping).
SHAPING_MODES = ("margin", "quality", "conditional_quality", "quality_with_outcome", "margin_with_outcome")

#: mart's baseline job where the user's base config says nothing: the two-agent debate of MARTI's example
#: ``examples/multi-agent/run_train_mad.sh`` (one GPU per agent, everything colocated, group-norm advantages).
MARTI_BASE: dict[str, Any] = {
    "agents.0.role": "generator",
    "agents.0.is_tuning": True,
    "agents.1.role": "generator",
    "agents.1.is_tuning": True,
    "default_agent.is_reasoning_model": False,
    "workflow_func_path": "marti/agent_workflows/debate_workflow.py",
    "processor_func_path": "marti/agent_workflows/debate_processor.py",
    "workflow_args.task": "math",
    "workflow_args.max_others": 5,
    "workflow_args.contain_self": True,
    "workflow_args.shuffle_responses": True,
    "actor_num_nodes": 1, "actor_num_gpus_per_node": 1,
    "ref_num_nodes": 1, "ref_num_gpus_per_node": 1,
    "train_batch_size": 16, "rollout_batch_size": 16,
    "n_samples_per_prompt": 2,
    "advantage_estimator": "group_norm",
    "colocate_all_models": True,
    "vllm_gpu_memory_utilization": 0.6,
    "zero_stage": 3, "bf16": True,
    "use_kl_loss": True, "kl_estimator": "k3", "init_kl_coef": 1e-3,
    # at this commit the trainer trains only agents whose pass rate was computed, which only
    # --dynamic_filtering_for_agents does (MultiAgent_PPOTrainer.fit/ppo_train); the example sets it
    "dynamic_filtering_for_agents": True,
}

class MartiParam(ParamSpec):
    """A MARTI knob: the phase comes from MARTI's step phases (``phase_of``), not from verl's key layout."""

    @property
    def phase(self) -> str:
        return "learning" if self.stage == "learning" else phase_of(self.key)


_P = MartiParam


def _flag_default(name: str) -> Any:
    return FLAGS[name].get("default")


SHARED_PARAMS: list[ParamSpec] = [
    # ------------------------------------------------------------------ system (throughput, memory)
    _P("micro_train_batch_size", "system", "int", _flag_default("micro_train_batch_size"),
       "Sequences per GPU in one forward/backward of each agent's actor update (DeepSpeed micro batch; gradients "
       "accumulate up to train_batch_size). Larger = faster update, more activation memory. Shared by all agents: "
       "the actor reads the global flags.", low=1, high=64,
       means="actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    _P("micro_rollout_batch_size", "system", "int", 1,
       "Micro batch of experience making (old/ref log-probs). MARTI's multi-agent experience maker asserts it is 1 "
       "(split_rollout_samples), so it is pinned here; listed so reviewers see why it does not move.", low=1, high=1),
    _P("vllm_gpu_memory_utilization", "system", "float", _flag_default("vllm_gpu_memory_utilization"),
       "Share of each GPU vLLM takes (weights + KV cache). With colocate_all_models the actor's DeepSpeed states "
       "share the GPU, so high values OOM the update; MARTI's debate example uses 0.6. Per agent: "
       "agents.<i>.vllm_gpu_memory_utilization.", low=0.2, high=0.95,
       means="actor_rollout_ref.rollout.gpu_memory_utilization"),
    _P("vllm_num_engines", "system", "int", 1,
       "vLLM engines per agent (MARTI's default None = no vLLM, which the workflows and packing_samples cannot use; "
       "mart's baseline is 1). More engines = more rollout parallelism, more GPUs; with colocate_all_models "
       "engines x TP must equal the actor's GPUs.", low=1, high=16),
    _P("vllm_tensor_parallel_size", "system", "categorical", _flag_default("vllm_tensor_parallel_size"),
       "Tensor parallel degree of each vLLM engine. Smaller = more independent engines on the same GPUs, usually "
       "faster when the model and its KV cache fit.", choices=(1, 2, 4, 8),
       means="actor_rollout_ref.rollout.tensor_model_parallel_size"),
    _P("colocate_all_models", "system", "bool", False,
       "Put actor, reference and vLLM engines of an agent on the same GPUs (a placement group). Halves the GPUs an "
       "agent needs; costs memory headroom and needs actor GPUs == engines x TP.", ),
    _P("gradient_checkpointing", "system", "bool", False,
       "Recompute activations in the backward pass: less update memory, ~30% slower update.",
       means="actor_rollout_ref.model.enable_gradient_checkpointing"),
    _P("enforce_eager", "system", "bool", False,
       "Disable CUDA graphs in vLLM: saves memory and capture time, slows decoding.",
       means="actor_rollout_ref.rollout.enforce_eager"),
    _P("enable_prefix_caching", "system", "bool", False,
       "vLLM prefix caching: the n samples of a prompt, and a debate's later rounds, share prompt KV cache.",
       means="actor_rollout_ref.rollout.enable_prefix_caching"),
    _P("vllm_enable_sleep", "system", "bool", False,
       "Put vLLM to sleep (free its memory) during training; only with colocate_all_models (MARTI turns it off "
       "otherwise) and not with async_train."),
    _P("deepspeed_enable_sleep", "system", "bool", False,
       "Offload the DeepSpeed states during rollout (colocated runs): more KV cache, slower phase switches."),
    _P("zero_stage", "system", "categorical", _flag_default("zero_stage"),
       "DeepSpeed ZeRO stage of the actor/reference: 3 shards parameters too (less memory, more communication).",
       choices=(1, 2, 3)),
    _P("adam_offload", "system", "bool", False, "Offload Adam states to CPU: less GPU memory, slower optimizer step.",
       means="actor_rollout_ref.actor.fsdp_config.optimizer_offload"),
    _P("packing_samples", "system", "bool", False,
       "Pack sequences without padding in the update (needs vLLM and flash attention, which MARTI then forces).",
       means="actor_rollout_ref.model.use_remove_padding"),
    _P(ASYNC_KEY, "system", "int", MARTI_ASYNC_DEFAULT,
       "Concurrent workflow tasks during rollout (env OPENRLHF_ASYNC_NUM_TASKS, read by MARTI's workflow wrapper; "
       "default 128; the paper measures 512 workers). More = more requests in flight per engine, more host memory.",
       low=1, high=1024,
       means=ASYNC_TASKS),
    # ------------------------------------------------------------------ learning (score)
    _P("actor_learning_rate", "learning", "log", _flag_default("actor_learning_rate"),
       "Actor learning rate (Adam), shared by every tuned agent at this MARTI commit (the optimizer reads the "
       "global flag, not the agent's JSON).", low=1e-7, high=1e-4,
       means="actor_rollout_ref.actor.optim.lr"),
    _P("init_kl_coef", "learning", "float", _flag_default("init_kl_coef"),
       "KL coefficient (a loss term with use_kl_loss, else a reward penalty); one controller for all agents.",
       low=0.0, high=0.1,
       means="actor_rollout_ref.actor.kl_loss_coef"),
    _P("use_kl_loss", "learning", "bool", False, "KL to the reference as a loss term (GRPO style) instead of in "
       "the reward.",
       means="actor_rollout_ref.actor.use_kl_loss"),
    _P("kl_estimator", "learning", "categorical", _flag_default("kl_estimator"),
       "KL estimator: k3 as a loss (GRPO), k1 in the reward; MARTI prints a recommendation otherwise.",
       choices=("k1", "k2", "k3"),
       means="actor_rollout_ref.actor.kl_loss_type"),
    _P("entropy_loss_coef", "learning", "float", None,
       "Entropy bonus coefficient (None = off and not logged; 0 = logged only).", low=0.0, high=0.01,
       nullable=True,
       means="actor_rollout_ref.actor.entropy_coeff"),
    _P("eps_clip", "learning", "float", _flag_default("eps_clip"), "PPO clip range.", low=0.05, high=0.5),
    _P("n_samples_per_prompt", "learning", "int", 2,
       "Responses per prompt per agent (the group of group_norm/rloo). Rollout work grows linearly with it. MARTI's "
       "default is 1, which its group estimators refuse; mart's baseline is 2 (the debate example).",
       low=1, high=64,
       means="actor_rollout_ref.rollout.n"),
    _P("temperature", "learning", "float", _flag_default("temperature"),
       "Sampling temperature of every agent without its own (agents.<i>.temperature).", low=0.1, high=1.5,
       means="actor_rollout_ref.rollout.temperature"),
    _P("top_p", "learning", "float", _flag_default("top_p"), "Nucleus sampling of every agent without its own.",
       low=0.5, high=1.0,
       means="actor_rollout_ref.rollout.top_p"),
    _P("policy_loss_type", "learning", "categorical", _flag_default("policy_loss_type"),
       "Policy loss: token-level PPO clipping or GSPO's sequence-level ratio (the debate example uses gspo).",
       choices=("ppo", "gspo")),
    _P("advantage_estimator", "learning", "categorical", "group_norm",
       "Advantage estimator. mart tunes critic-free runs (gae would need a critic per agent); group_norm is GRPO.",
       choices=("group_norm", "dr_grpo", "rloo", "reinforce_baseline", "reinforce")),
    _P("workflow_args.num_rounds", "learning", "int", 2,
       "Debate rounds of the debate workflow (workflow_args JSON). More rounds = longer rollouts and more "
       "per-agent samples per prompt; the paper's 8-round debate is ~3000 s per step.", low=1, high=8,
       means=NUM_ROUNDS),
    _P("reward_alloc.name", "learning", "categorical", "margin",
       "Influence-aware reward shaping mode (reward_alloc JSON): margin (R + a(R - Q)), quality (R + a(QR - (1-Q)"
       "(1-R))) and their variants; None = raw rewards. The paper's ablation: no shaping 45.6 -> 36.6.",
       choices=SHAPING_MODES, nullable=True),
    _P("reward_alloc.alpha", "learning", "float", 0.5,
       "Weight a of the shaping term.", low=0.0, high=2.0),
    _P("reward_alloc.beta", "learning", "float", 0.5,
       "Weight of the final outcome reward added to each turn (the *_with_outcome modes).", low=0.0, high=2.0),
]


def agent_params(n_agents: int) -> list[ParamSpec]:
    """Per-agent knobs; None (the default) leaves the key out of that agent's JSON."""
    out: list[ParamSpec] = []
    for i in range(n_agents):
        out += [
            _P(f"agents.{i}.temperature", "learning", "float", None,
               f"Sampling temperature of agent {i} alone (None: the shared temperature). Diverse agents debate "
               "better; a too-cold critic agent copies the others.", low=0.1, high=1.5, nullable=True,
               means="actor_rollout_ref.rollout.temperature"),
            _P(f"agents.{i}.vllm_gpu_memory_utilization", "system", "float", None,
               f"vLLM memory share of agent {i}'s engines (None: the shared value); agents with larger models "
               "or longer contexts need their own.", low=0.2, high=0.95, nullable=True,
               means="actor_rollout_ref.rollout.gpu_memory_utilization"),
        ]
    return out


#: the step phase each knob acts on (MARTI's phases: gen = workflow rollout, make_experience = reward,
#: old/ref log-probs, update_actor = DeepSpeed training + weight broadcast to vLLM).
def phase_of(key: str) -> str:
    name = key.rsplit(".", 1)[-1]
    if key.startswith(("workflow_args.", "reward_alloc.")) or name in (
            "actor_learning_rate", "init_kl_coef", "use_kl_loss", "kl_estimator", "entropy_loss_coef", "eps_clip",
            "policy_loss_type", "advantage_estimator", "temperature", "top_p", "n_samples_per_prompt"):
        return "learning"
    if name.startswith("vllm_") or name in ("enforce_eager", "enable_prefix_caching", ASYNC_KEY):
        return "gen"
    if name == "micro_rollout_batch_size":
        return "make_experience"
    if name in ("micro_train_batch_size", "gradient_checkpointing", "adam_offload", "packing_samples", "zero_stage",
                "deepspeed_enable_sleep"):
        return "update_actor"
    return "all"


# ------------------------------------------------------------------------------------------------ resolution

def agent_ids(config: dict[str, Any]) -> list[int]:
    """The agent indices a config defines (``agents.<i>.*`` keys), in order."""
    ids = {int(k.split(".")[1]) for k in config if k.startswith("agents.") and k.split(".")[1].isdigit()}
    return sorted(ids)


def global_value(config: dict[str, Any], name: str) -> Any:
    """A global flag's value: the config's, else MARTI's argparse default."""
    if name in config:
        return config[name]
    return FLAGS.get(name, {}).get("default")


def agent_value(config: dict[str, Any], i: int, name: str) -> Any:
    """What MARTI resolves for agent ``i``: its own JSON key, else ``--default_agent``'s, else the global flag."""
    for key in (f"agents.{i}.{name}", f"default_agent.{name}"):
        if config.get(key) is not None:
            return config[key]
    return global_value(config, name)


def job_gpus(config: dict[str, Any]) -> int:
    """GPUs the job occupies: per tuned agent, its actor's (colocated), else actor + reference + vLLM engines."""
    total = 0
    for i in agent_ids(config):
        v = lambda name: agent_value(config, i, name)  # noqa: E731
        if not v("is_tuning"):
            continue
        actor = int(v("actor_num_nodes")) * int(v("actor_num_gpus_per_node"))
        if v("colocate_all_models"):
            total += actor
            continue
        ref = 0 if v("colocate_actor_ref") else int(v("ref_num_nodes")) * int(v("ref_num_gpus_per_node"))
        engines = int(v("vllm_num_engines") or 0) * int(v("vllm_tensor_parallel_size"))
        total += actor + ref + engines
    return max(1, total)


def samples_per_agent_step(config: dict[str, Any]) -> int:
    """Experiences one agent trains on per step, estimated: prompts x samples per prompt x workflow rounds."""
    rounds = config.get("workflow_args.num_rounds")
    rounds = int(rounds) if isinstance(rounds, int) and not isinstance(rounds, bool) and rounds > 0 else 1
    return int(global_value(config, "rollout_batch_size")) * int(global_value(config, "n_samples_per_prompt")) * rounds


# ------------------------------------------------------------------------------------------------ constraints

def _each_agent(c: dict[str, Any], check: Callable[[int, Callable[[str], Any]], str | None]) -> str | None:
    msgs = []
    for i in agent_ids(c):
        msg = check(i, lambda name, i=i: agent_value(c, i, name))
        if msg:
            msgs.append(f"agent {i}: {msg}")
    return "; ".join(msgs) or None


def _check_colocate_engines(c: dict[str, Any]) -> str | None:
    def one(i: int, v: Callable[[str], Any]) -> str | None:
        engines = int(v("vllm_num_engines") or 0)
        if not (v("colocate_all_models") and engines > 0 and (v("is_tuning") or v("pretrain") is not None)):
            return None
        actor = int(v("actor_num_nodes")) * int(v("actor_num_gpus_per_node"))
        vllm = engines * int(v("vllm_tensor_parallel_size"))
        if actor != vllm:
            return (f"with colocate_all_models, actor_num_nodes x actor_num_gpus_per_node ({actor}) must equal "
                    f"vllm_num_engines x vllm_tensor_parallel_size ({vllm}) (MARTI asserts it at start-up)")
        return None
    return _each_agent(c, one)


def _check_colocate_ref(c: dict[str, Any]) -> str | None:
    def one(i: int, v: Callable[[str], Any]) -> str | None:
        if not (v("is_tuning") and (v("colocate_actor_ref") or v("colocate_all_models"))):
            return None
        if (int(v("actor_num_nodes")), int(v("actor_num_gpus_per_node"))) != (
                int(v("ref_num_nodes")), int(v("ref_num_gpus_per_node"))):
            return "colocated actor and reference need the same num_nodes and num_gpus_per_node (MARTI asserts it)"
        return None
    return _each_agent(c, one)


def _check_sample_batches(c: dict[str, Any]) -> str | None:
    g = lambda name: global_value(c, name)  # noqa: E731
    batches = int(g("n_samples_per_prompt")) * int(g("rollout_batch_size")) // int(g("micro_rollout_batch_size"))
    procs = (int(g("actor_num_nodes")) * int(g("actor_num_gpus_per_node")) // int(g("ring_attn_size"))
             // int(g("ds_tensor_parallel_size")))
    if batches < procs:
        return (f"n_samples_per_prompt x rollout_batch_size // micro_rollout_batch_size ({batches}) must be >= the "
                f"actor's processes ({procs}) (MARTI asserts it after parsing)")
    return None


def _check_micro_rollout(c: dict[str, Any]) -> str | None:
    if int(global_value(c, "micro_rollout_batch_size")) != 1:
        return "MARTI's multi-agent experience maker asserts micro_rollout_batch_size == 1"
    if global_value(c, "use_dynamic_batch"):
        return "MARTI's multi-agent experience maker refuses use_dynamic_batch"
    return None


def _check_group_size(c: dict[str, Any]) -> str | None:
    max_nodes = c.get("workflow_args.max_num_nodes", -1)

    def one(i: int, v: Callable[[str], Any]) -> str | None:
        if str(v("advantage_estimator")) in ("rloo", "reinforce_baseline", "group_norm") and \
                int(v("n_samples_per_prompt") or 1) < 2 and not (isinstance(max_nodes, int) and max_nodes > 1):
            return f"{v('advantage_estimator')} requires n_samples_per_prompt > 1 (MARTI asserts it)"
        return None
    return _each_agent(c, one)


def _check_packing(c: dict[str, Any]) -> str | None:
    def one(i: int, v: Callable[[str], Any]) -> str | None:
        if v("packing_samples") and not int(v("vllm_num_engines") or 0) > 0:
            return "packing_samples needs vLLM (vllm_num_engines > 0; MARTI asserts it)"
        return None
    return _each_agent(c, one)


def _check_async_sleep(c: dict[str, Any]) -> str | None:
    def one(i: int, v: Callable[[str], Any]) -> str | None:
        if v("async_train") and v("vllm_enable_sleep") and v("colocate_all_models"):
            return "async_train cannot run with vllm_enable_sleep (MARTI asserts it)"
        return None
    return _each_agent(c, one)


def _check_trains_agents(c: dict[str, Any]) -> str | None:
    if not agent_ids(c):
        return "no agent defined (agents.<i>.* keys; MARTI requires --agents)"
    if not global_value(c, "dynamic_filtering_for_agents"):
        return ("dynamic_filtering_for_agents must be true: at this MARTI commit the multi-agent trainer trains only "
                "agents whose pass rate that option computes (ppo_train skips the others), so no step would be logged")
    if global_value(c, "apply_chat_template"):
        return "apply_chat_template must be false for multi-agent training (MARTI's trainer asserts it)"
    return None


def _check_dynamic_filtering(c: dict[str, Any]) -> str | None:
    def one(i: int, v: Callable[[str], Any]) -> str | None:
        if not v("dynamic_filtering"):
            return None
        lo, hi = (v("dynamic_filtering_reward_range") or (0, 1))[:2]
        if not float(lo) < float(hi):
            return "dynamic_filtering_reward_range must be increasing"
        if not (v("remote_rm_url") or v("agent_func_path")):
            return "dynamic_filtering needs remote_rm_url or agent_func_path"
        if int(v("n_samples_per_prompt") or 1) < 2:
            return "dynamic_filtering needs n_samples_per_prompt > 1"
        return None
    return _each_agent(c, one)


def _check_shaping(c: dict[str, Any]) -> str | None:
    for key in ("reward_alloc.alpha", "reward_alloc.beta"):
        value = c.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(float(value))):
            return f"{key} must be a finite number"
    return None


def _constraint(name: str, description: str, check: Callable[[dict[str, Any]], str | None]) -> Constraint:
    def safe(config: dict[str, Any]) -> str | None:
        try:
            return check(config)
        except (TypeError, ValueError) as e:
            return f"cannot check ({e})."

    return Constraint(name, description, safe)


CONSTRAINTS: list[Constraint] = [
    _constraint("colocate_engines_match_actor",
                "MARTI init_agent: colocate_all_models needs actor_num_nodes x actor_num_gpus_per_node == "
                "vllm_num_engines x vllm_tensor_parallel_size, per agent.", _check_colocate_engines),
    _constraint("colocate_actor_ref_shape",
                "MARTI train(): colocated actor and reference need the same nodes and GPUs per node.", _check_colocate_ref),
    _constraint("sample_batches_cover_actor",
                "MARTI CLI: n_samples_per_prompt x rollout_batch_size // micro_rollout_batch_size >= actor processes.",
                _check_sample_batches),
    _constraint("micro_rollout_batch_is_1",
                "MARTI multi-agent experience maker: micro_rollout_batch_size == 1, no use_dynamic_batch.",
                _check_micro_rollout),
    _constraint("group_estimator_needs_samples",
                "MARTI CLI: group_norm / rloo / reinforce_baseline need n_samples_per_prompt > 1.", _check_group_size),
    _constraint("packing_needs_vllm", "MARTI CLI: packing_samples needs vLLM engines.", _check_packing),
    _constraint("async_train_without_sleep", "MARTI CLI: async_train cannot use vllm_enable_sleep.", _check_async_sleep),
    _constraint("agents_are_trained",
                "MARTI trainer: at least one agent; dynamic_filtering_for_agents on (else no agent trains); no chat "
                "template.", _check_trains_agents),
    _constraint("dynamic_filtering_inputs", "MARTI CLI: dynamic_filtering's range, reward source and group size.",
                _check_dynamic_filtering),
    _constraint("shaping_weights_finite", "reward_alloc alpha/beta are finite numbers.", _check_shaping),
]


def build_space(n_agents: int) -> SearchSpace:
    """The catalogue for a job of ``n_agents`` agents (the per-agent knobs depend on it)."""
    return SearchSpace(backend="marti", params=SHARED_PARAMS + agent_params(n_agents), constraints=CONSTRAINTS)


__all__ = ["AGENT_KEYS", "ASYNC_ENV", "MartiParam", "ASYNC_KEY", "CONSTRAINTS", "JSON_FLAGS", "MARTI_BASE", "SHAPING_MODES",
           "agent_ids", "agent_value", "build_space", "global_value", "job_gpus", "phase_of",
           "samples_per_agent_step"]
