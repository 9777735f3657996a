"""Search space of the local backend (the embedded GRPO workload): the knobs it implements for real.

Defaults are the backend's defaults (``mart.trial_runner.local.config``); ranges keep the workload
meaningful. The system knobs change speed and memory, not the maths (micro-batching is exact and the
rollout samples do not depend on chunking); the learning knobs change the learning. The defaults
are conservative on purpose, as verl's are: small micro-batches and gradient checkpointing on.
"""

from __future__ import annotations

from typing import Any

from mart.state.search_space import Constraint, ParamSpec, SearchSpace
from mart.trial_runner.local.config import DEFAULTS, RULES, parse_overrides

ROLLOUT = "actor_rollout_ref.rollout."
ACTOR = "actor_rollout_ref.actor."


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
       stage="system", low=64, high=8192),
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
