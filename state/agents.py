"""Names of multi-agent jobs (MARTI-style workflows): per-agent metric prefixes and per-agent knob keys.

A multi-agent trial logs each agent's verl-style metrics under ``agent<i>/`` (``agent1/actor/entropy``) beside
the team's (``critic/score/mean``, ``val-core/...``) and workflow signals (``workflow/answer_change_rate``);
a per-agent knob is ``agents.<i>.<rest>`` (``agents.1.actor.optim.lr``) beside shared workflow and shaping
knobs (``workflow.num_rounds``, ``reward.shaping_alpha``). Every layer parses these names here, nowhere else.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from mart.state.metrics import StepRecord
from mart.state.search_space import KnobEffect, ParamSpec

_METRIC = re.compile(r"^agent(\d+)/(.+)$")
_KNOB = re.compile(r"^agents\.(\d+)\.(.+)$")

# per-agent workflow signals (under the agent prefix) and team workflow signals
COPY_RATE = "copy_rate"
"""Share of an agent's answers that repeat another agent's earlier answer (``agent<i>/copy_rate``)."""
REWARD_SHARE = "reward_share"
"""An agent's share of the team's summed (shaped) reward in a step (``agent<i>/reward_share``)."""
ANSWER_CHANGE_RATE = "workflow/answer_change_rate"
"""Share of answers a debate round after the first changed."""
AGREEMENT = "workflow/agreement"
"""Share of agents whose final answer is the majority's."""

# shared workflow and reward-shaping knobs (MARTI: R~ = R + alpha * Delta, Delta by mode, Q over a scope)
NUM_ROUNDS = "workflow.num_rounds"
SHAPING_MODE = "reward.shaping_mode"
SHAPING_ALPHA = "reward.shaping_alpha"
HISTORY_SCOPE = "reward.history_scope"
SHAPING_KNOBS = (SHAPING_MODE, SHAPING_ALPHA, HISTORY_SCOPE)
#: concurrent workflow tasks of an asynchronous rollout on a verl job (MARTI's OPENRLHF_ASYNC_NUM_TASKS; 0 = sync)
ASYNC_TASKS = "rollout.async_num_tasks"

# The records of the workflow knobs the multi-agent catalogues share (the local team's, the simulator's); a backend
# keeps their facts and may narrow the range or set its own default (``dataclasses.replace``).
ASYNC_TASKS_PARAM = ParamSpec(
    ASYNC_TASKS, "system", "int", 0,
    "MARTI's concurrent workflow tasks (OPENRLHF_ASYNC_NUM_TASKS; a task = one prompt's group): 0 = synchronous "
    "rounds with a barrier each; more tasks overlap the rounds, too few starve vLLM",
    low=0, high=2048, model="async",
    effect=KnobEffect("up", 0.0, phase="gen", note="concurrent workflow tasks overlap the stages' barriers; too few "
                      "starve the engines"),
    # 0 = synchronous, where doubling stays at 0: MARTI's published async figures use 512 workers (chain 612.6 s ->
    # 498.4 s)
    zero_start=512)
NUM_ROUNDS_PARAM = ParamSpec(
    NUM_ROUNDS, "learning", "int", 2,
    "debate rounds: each round's prompt shows the previous answers (longer prompts)", low=1, high=4,
    move="count",  # one round more or less, not twice as many
    effect=KnobEffect("down", 0.3, phase="gen", note="each round is one more generation pass per agent"))


def split_metric(key: str) -> tuple[int | None, str]:
    """``agent1/actor/entropy`` -> (1, ``actor/entropy``); a team metric -> (None, key)."""
    m = _METRIC.match(key)
    return (int(m.group(1)), m.group(2)) if m else (None, key)


def agent_metric(agent: int, name: str) -> str:
    return f"agent{agent}/{name}"


def split_knob(key: str) -> tuple[int | None, str]:
    """``agents.1.actor.optim.lr`` -> (1, ``actor.optim.lr``); a shared knob -> (None, key)."""
    m = _KNOB.match(key)
    return (int(m.group(1)), m.group(2)) if m else (None, key)


def agent_knob(agent: int, rest: str) -> str:
    return f"agents.{agent}.{rest}"


def knob_agent(key: str) -> int | None:
    return split_knob(key)[0]


def agents_in_records(records: Iterable[StepRecord]) -> list[int]:
    """The agent indices that log metrics in a stream, ascending (empty for a single-agent job)."""
    found: set[int] = set()
    for r in records:
        for k in r.data:
            agent, _ = split_metric(k)
            if agent is not None:
                found.add(agent)
    return sorted(found)


def agent_stream(records: Iterable[StepRecord], agent: int) -> list[StepRecord]:
    """One agent's metrics with the ``agent<i>/`` prefix stripped (steps where it logged nothing are left out),
    so that every single-agent rule reads them under verl's names."""
    prefix = agent_metric(agent, "")
    out = []
    for r in records:
        data = {k[len(prefix):]: v for k, v in r.data.items() if k.startswith(prefix)}
        if data:
            out.append(StepRecord(step=r.step, data=data))
    return out


def agents_in_config(config: Iterable[str]) -> list[int]:
    """The agent indices that own a knob among these keys, ascending."""
    return sorted({a for a in (knob_agent(k) for k in config) if a is not None})


def group_by_agent(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """Split a flat config into shared knobs and per-agent knobs (``{agent: {rest: value}}``), order kept."""
    shared: dict[str, Any] = {}
    per_agent: dict[int, dict[str, Any]] = {}
    for key, value in config.items():
        agent, rest = split_knob(key)
        if agent is None:
            shared[key] = value
        else:
            per_agent.setdefault(agent, {})[rest] = value
    return shared, dict(sorted(per_agent.items()))
