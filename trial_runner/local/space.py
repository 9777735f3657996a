"""Search space of the local backend (the embedded GRPO workload): the knobs it implements for real.

Defaults are the backend's defaults (``mart.trial_runner.local.config``); ranges keep the workload
meaningful. The system knobs change speed and memory, not the maths (micro-batching is exact and the
rollout samples do not depend on chunking); the learning knobs change the learning. The defaults
are conservative on purpose, as verl's are: small micro-batches and gradient checkpointing on.

The keys are verl's, and so is what the tuner knows about each knob (its effect, the job model's name for it,
the agents' prior, the words reviewers use): a record that leaves those facts unset means the verl catalogue's
record of the same key (``mart.nodes.agents.knob_effects.knob_facts``), so they are written once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mart.state.agents import NUM_ROUNDS_PARAM
from mart.state.search_space import Constraint, ParamSpec, SearchSpace
from mart.state.verl_keys import ACTOR, ROLLOUT
from mart.trial_runner.local.config import DEFAULTS, RULES, parse_overrides


def _p(key: str, kind: str, description: str, **kw: Any) -> ParamSpec:
    stage = kw.pop("stage")
    return ParamSpec(key=key, stage=stage, kind=kind, default=DEFAULTS[key], description=description, **kw)


SYSTEM = [
    _p(ROLLOUT + "max_num_seqs", "int", "Sequences generated together; more = fewer sequential decode loops, more KV-cache memory.",
       stage="system", low=4, high=256),
    _p(ROLLOUT + "log_prob_micro_batch_size_per_gpu", "int", "Sequences per forward when recomputing old log-probs (forward only: cheap in memory).",
       stage="system", low=1, high=256),
    _p("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "int", "Sequences per forward of the reference policy (with use_kl_loss).",
       stage="system", low=1, high=256),
    _p(ACTOR + "ppo_micro_batch_size_per_gpu", "int", "Sequences per forward/backward of the update; activations grow with it. Must divide ppo_mini_batch_size x rollout.n.",
       stage="system", low=1, high=128),
    _p(ACTOR + "use_dynamic_bsz", "bool", "Form micro-batches by token count (ppo_max_token_len_per_gpu), also for the log-prob passes.",
       stage="system"),
    _p(ACTOR + "ppo_max_token_len_per_gpu", "int", "Token cap of a dynamic micro-batch; must hold one longest sequence (max_prompt_length + max_response_length).",
       stage="system", low=64, high=8192, schedule=True),
    _p("actor_rollout_ref.model.enable_gradient_checkpointing", "bool", "Recompute activations in backward: much less update memory, ~1/3 more update compute.",
       stage="system"),
]

LEARNING = [
    _p(ACTOR + "optim.lr", "log", "AdamW learning rate; around 1e-3 and above the policy degrades (reward collapse).",
       stage="learning", low=1e-5, high=3e-3),
    _p(ACTOR + "use_kl_loss", "bool", "KL-to-reference loss (adds the ref log-prob phase).", stage="learning"),
    _p(ACTOR + "kl_loss_coef", "float", "Weight of the KL loss (with use_kl_loss).", stage="learning", low=0.0, high=0.1),
    _p(ACTOR + "entropy_coeff", "float", "Entropy bonus; keeps exploration, too much keeps the policy noisy.", stage="learning", low=0.0, high=0.02),
    _p(ACTOR + "clip_ratio_low", "float", "PPO clip below (1 - clip_ratio_low).", stage="learning", low=0.05, high=0.4),
    _p(ACTOR + "clip_ratio_high", "float", "PPO clip above (1 + clip_ratio_high; DAPO uses 0.28).", stage="learning", low=0.05, high=0.5),
    _p(ROLLOUT + "n", "int", "Samples per prompt (GRPO group); more = better advantages, proportionally more compute per step.",
       stage="learning", low=2, high=16),
    _p(ROLLOUT + "temperature", "float", "Rollout sampling temperature.", stage="learning", low=0.5, high=1.5),
]


def _constraint(name: str, description: str) -> Constraint:
    rule = next(check for n, _, check in RULES if n == name)

    def check(config: dict[str, Any]) -> str | None:
        known = {k: v for k, v in config.items() if k in DEFAULTS}
        cfg, _ = parse_overrides(known)
        if cfg is None:  # a bad single value: ParamSpec.validate reports it
            return None
        return rule(cfg)

    return Constraint(name=name, description=description, check=check)


SEARCH_SPACE = SearchSpace(
    backend="local",
    params=SYSTEM + LEARNING,
    constraints=[_constraint(name, description) for name, description, _ in RULES],
)

RESPONSE_LIMIT = _p("data.max_response_length", "int", "Generation cap in tokens; a response cut at it scores 0 in the "
                    "long task (watch response_length/clip_ratio). Longer = more generation and update work per step.",
                    stage="learning", low=4, high=48)
LONG_SEARCH_SPACE = SearchSpace(
    backend="local",
    params=SYSTEM + LEARNING + [RESPONSE_LIMIT],
    constraints=list(SEARCH_SPACE.constraints),
)
"""The catalogue of the long task (``local.task.name=digit_sort_long``): the response limit is a learning knob
there, the capacity a staged schedule raises as answers lengthen (the default task's catalogue stays as it was)."""


# --- multi-agent (workflow.name set): per-agent learning knobs, workflow and shaping knobs -------------------
#: each agent's copy of a shared learning knob: the shared record (type, range, default, facts) under the agent's key
PER_AGENT_HELP = {
    "actor.optim.lr": "Agent {i}'s AdamW learning rate (its own optimizer).",
    "actor.kl_loss_coef": "Agent {i}'s KL-to-reference weight (with use_kl_loss).",
    "actor.entropy_coeff": "Agent {i}'s entropy bonus.",
    "rollout.temperature": "Agent {i}'s sampling temperature (diversity between agents feeds the debate).",
}


def team_search_space(workflow: str, num_agents: int) -> SearchSpace:
    """The catalogue of a multi-agent local job: the shared system knobs (stage 1: micro-batches, rollout
    concurrency; every agent uses them), the shared learning knobs that are not per agent, each agent's
    lr / KL / entropy / temperature (stage 2), and the workflow and shaping knobs (stage 2)."""
    from mart.trial_runner.local.team_config import PER_AGENT, TEAM_KEYS, agent_key, team_config_errors

    replaced = set(PER_AGENT.values())
    params = SYSTEM + [p for p in LEARNING if p.key not in replaced]
    for i in range(num_agents):
        for rel, shared in PER_AGENT.items():
            params.append(dataclasses.replace(SEARCH_SPACE[shared], key=agent_key(i, rel),
                                              description=PER_AGENT_HELP[rel].format(i=i)))

    def team(key: str, kind: str, **kw: Any) -> ParamSpec:
        default, text = TEAM_KEYS[key][:2]
        return ParamSpec(key=key, stage="learning", kind=kind, default=default, description=text, **kw)

    if workflow == "debate":  # the shared record, over the rounds a CPU debate affords
        default, text = TEAM_KEYS[NUM_ROUNDS_PARAM.key][:2]
        params.append(dataclasses.replace(NUM_ROUNDS_PARAM, default=default, description=text, high=3))
    params += [team("reward.shaping_mode", "categorical", choices=TEAM_KEYS["reward.shaping_mode"][5]),
               team("reward.shaping_alpha", "float", low=0.0, high=2.0),
               team("reward.history_scope", "int", low=1, high=3)]

    def fits(config: dict[str, Any]) -> str | None:
        cfg, errors = team_config_errors(config)
        return next((e for e in errors if "[rule team_lengths_fit]" in e), None)

    constraints = [_constraint(name, description) for name, description, _ in RULES]
    constraints.append(Constraint(name="team_lengths_fit", description="task prompt + the peers' answers shown + "
                                  "max_response_length fit local.model.block_size", check=fits))
    return SearchSpace(backend="local", params=params, constraints=constraints)
