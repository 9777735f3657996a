"""The multi-agent (team) config of the local workload: a workflow of 2-3 tiny policies (MARTI-style).

A team config is a flat mapping like the single-agent one (``config.py``) plus three families of keys:

    workflow.name / workflow.num_agents / workflow.num_rounds          the workflow (debate or chain)
    reward.shaping_mode / reward.shaping_alpha / reward.history_scope  per-agent reward shaping (MARTI)
    agents.<i>.actor.optim.lr / agents.<i>.actor.kl_loss_coef /        agent i's own learning knobs;
    agents.<i>.actor.entropy_coeff / agents.<i>.rollout.temperature    they replace the shared verl keys

Every other key is shared by the agents and means what it means single-agent (batch sizes, the model,
the task, micro-batching). A config is a team config when it has ``workflow.name``; without it the
worker runs the single-agent trainer as before, so nothing changes for single-agent trials.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from mart.state.search_space import ConfigError
from mart.trial_runner.local.config import DEFAULTS, FIELDS, LocalConfig, _coerce, config_errors

WORKFLOWS = ("debate", "chain")
SHAPING_MODES = ("none", "margin", "quality")
MAX_AGENTS = 3
SEED_STRIDE = 7919  # agent i samples with seed + i * SEED_STRIDE: per-agent streams, same trial seed

PER_AGENT: dict[str, str] = {
    "actor.optim.lr": "actor_rollout_ref.actor.optim.lr",
    "actor.kl_loss_coef": "actor_rollout_ref.actor.kl_loss_coef",
    "actor.entropy_coeff": "actor_rollout_ref.actor.entropy_coeff",
    "rollout.temperature": "actor_rollout_ref.rollout.temperature",
}
"""agent-relative key -> the shared verl key it replaces for that agent (same type, range and default)."""

# key -> (default, help, type, low, high, choices)
TEAM_KEYS: dict[str, tuple[Any, str, type, float | None, float | None, tuple | None]] = {
    "workflow.name": ("debate", "debate: every agent answers, sees the others' answers, answers again for num_rounds rounds, majority vote (ties: the last agent); chain: agent 0 drafts, each next agent revises the previous answer.", str, None, None, WORKFLOWS),
    "workflow.num_agents": (2, "Agents (2-3), each its own policy, optimizer and reference, all started from the same cached base model.", int, 2, MAX_AGENTS, None),
    "workflow.num_rounds": (2, "Debate rounds (round 0 answers alone; each later round sees the other agents' previous answers). Unused by chain.", int, 1, 4, None),
    "reward.shaping_mode": ("quality", "MARTI's per-agent shaping R + alpha * Delta: margin Delta = R - Q, quality Delta = Q*R - (1-Q)*(1-R); none = the verifier reward alone.", str, None, None, SHAPING_MODES),
    "reward.shaping_alpha": (0.5, "Weight alpha of the shaping term.", float, 0.0, 4.0, None),
    "reward.history_scope": (1, "Turns of history Q averages over: the verifier scores of the answers of the last history_scope turns before this one in the same episode (what the agent built on).", int, 1, 4, None),
}

_AGENT_KEY = re.compile(r"^agents\.(\d+)\.(.+)$")


def agent_key(i: int, rel: str) -> str:
    return f"agents.{i}.{rel}"


def is_team_config(flat: Mapping[str, Any]) -> bool:
    """A team config names its workflow; a single-agent config has no team keys at all."""
    return "workflow.name" in flat


def team_defaults(workflow: str = "debate", num_agents: int | None = None,
                  base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The team keys' defaults (per-agent keys start at the shared keys' values in ``base``)."""
    base = {**DEFAULTS, **(base or {})}
    out = {k: v[0] for k, v in TEAM_KEYS.items()}
    out["workflow.name"] = workflow
    out["workflow.num_agents"] = int(num_agents or 2)
    for i in range(out["workflow.num_agents"]):
        for rel, shared in PER_AGENT.items():
            out[agent_key(i, rel)] = base[shared]
    return out


@dataclass(frozen=True)
class TeamConfig:
    """The shared config, the workflow and shaping, and each agent's own config (its knobs, its seed)."""

    base: LocalConfig
    workflow: str
    num_agents: int
    num_rounds: int
    shaping_mode: str
    shaping_alpha: float
    history_scope: int
    agents: tuple[LocalConfig, ...]

    @property
    def turns(self) -> int:
        """Answers per agent per episode (debate: one per round; chain: one)."""
        return self.num_rounds if self.workflow == "debate" else 1

    @property
    def peers_seen(self) -> int:
        """Answers appended to an agent's prompt at most (debate: the others; chain: the previous agent)."""
        return self.num_agents - 1 if self.workflow == "debate" else 1

    @property
    def peer_answer_tokens(self) -> int:
        """A peer's answer is shown cut to max_digits + 1 tokens (one more than any right answer, so a
        rambling answer still shows that it rambles), then <sep>."""
        return self.base.max_digits + 1

    @property
    def max_prompt_tokens(self) -> int:
        return self.base.max_digits + 2 + self.peers_seen * (self.peer_answer_tokens + 1)


def _coerce_team(key: str, value: Any) -> Any:
    default, _, want, low, high, choices = TEAM_KEYS[key]
    if want is str:
        if not isinstance(value, str) or value not in choices:
            raise ConfigError(f"`{key}` must be one of {list(choices)}, but got {value!r}.")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"`{key}` must be a number, but got {value!r}.")
    try:
        num = float(value)
    except ValueError:
        raise ConfigError(f"`{key}` must be a number, but got {value!r}.") from None
    if want is int:
        if num != int(num):
            raise ConfigError(f"`{key}` must be an integer, but got {value!r}.")
        num = int(num)
    if not low <= num <= high:
        raise ConfigError(f"`{key}` must lie in [{low}, {high}], but got {value!r}.")
    return num


def team_config_errors(flat: Mapping[str, Any]) -> tuple[TeamConfig | None, list[str]]:
    """Defaults + ``flat`` as a team config (None if invalid) and every error, each naming its key/rule."""
    shared = {k: v for k, v in flat.items() if k not in TEAM_KEYS and not _AGENT_KEY.match(k)}
    base, errors = config_errors(shared)
    team: dict[str, Any] = {k: v[0] for k, v in TEAM_KEYS.items()}
    for key in TEAM_KEYS:
        if key in flat:
            try:
                team[key] = _coerce_team(key, flat[key])
            except ConfigError as e:
                errors.append(str(e))
    n = team["workflow.num_agents"] if isinstance(team["workflow.num_agents"], int) else 2
    per_agent: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, value in flat.items():
        m = _AGENT_KEY.match(key)
        if not m:
            continue
        i, rel = int(m.group(1)), m.group(2)
        if rel not in PER_AGENT:
            close = difflib.get_close_matches(rel, list(PER_AGENT), n=1, cutoff=0.6)
            hint = f" (did you mean `agents.{i}.{close[0]}`?)" if close else ""
            errors.append(f"unknown per-agent key `{key}`{hint}; per-agent keys: "
                          + ", ".join(f"agents.<i>.{r}" for r in PER_AGENT) + ".")
            continue
        if i >= n:
            errors.append(f"`{key}` names agent {i}, but `workflow.num_agents` is {n} (agents 0..{n - 1}).")
            continue
        try:
            per_agent[i][FIELDS[PER_AGENT[rel]].name] = _coerce(PER_AGENT[rel], value)
        except ConfigError as e:
            errors.append(str(e).replace(f"`{PER_AGENT[rel]}`", f"`{key}`"))
    if base is None or errors:
        return None, errors
    cfg = TeamConfig(
        base=base, workflow=team["workflow.name"], num_agents=n, num_rounds=team["workflow.num_rounds"],
        shaping_mode=team["reward.shaping_mode"], shaping_alpha=float(team["reward.shaping_alpha"]),
        history_scope=team["reward.history_scope"],
        agents=tuple(replace(base, **per_agent[i], seed=(base.seed + i * SEED_STRIDE) % 2**31) for i in range(n)),
    )
    errors = [f"{msg} [rule {name}]" for name, _, check in TEAM_RULES if (msg := check(cfg))]
    return (None, errors) if errors else (cfg, [])


def _team_lengths(t: TeamConfig) -> str | None:
    need = t.max_prompt_tokens + t.base.max_response_length
    if need > t.base.block_size:
        return (f"the {t.workflow} prompts need `local.model.block_size` >= {need} (task prompt {t.base.max_digits + 2} "
                f"+ {t.peers_seen} peer answer(s) of {t.peer_answer_tokens} tokens + <sep> each + "
                f"`data.max_response_length` {t.base.max_response_length}), but it is {t.base.block_size}.")
    return None


TEAM_RULES = [
    ("team_lengths_fit", "task prompt + the peers' answers shown + max_response_length fit local.model.block_size", _team_lengths),
]


def load_team_config(flat: Mapping[str, Any]) -> TeamConfig:
    """Raises ConfigError naming every bad key and broken rule."""
    cfg, errors = team_config_errors(flat)
    if errors:
        raise ConfigError("\n".join(errors))
    assert cfg is not None
    return cfg
