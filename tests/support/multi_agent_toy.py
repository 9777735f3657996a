"""The toy backend as a two-agent job: each agent has its own learning rate and entropy bonus
(``agents.<i>.actor.optim.lr``, ``agents.<i>.actor.entropy_coeff``) and logs its metrics under ``agent<i>/``;
the team logs the mean reward and the validation score, the workflow its answer-change rate.

An agent whose learning rate is above 0.02 collapses (its entropy falls to 0.02 after step 2 on the poll
clock) and drags the team's score down; the other agent is unaffected. Plugin path:
``tests.support.multi_agent_toy:make_backend`` (same options as the toy backend).
"""

from __future__ import annotations

import math

from mart.state.agents import NUM_ROUNDS, SHAPING_ALPHA, agent_knob, agent_metric
from mart.state.search_space import ParamSpec, SearchSpace
from tests.support import toy_backend as toy

AGENTS = (0, 1)


def lr(agent: int) -> str:
    return agent_knob(agent, "actor.optim.lr")


def ent(agent: int) -> str:
    return agent_knob(agent, "actor.entropy_coeff")


SPACE = SearchSpace(
    backend="toy-multi",
    params=[
        *(p for p in toy.SPACE.params if p.stage == "system"),
        *(p for a in AGENTS for p in (
            ParamSpec(lr(a), "learning", "log", 1e-3, f"agent {a} learning rate", low=1e-5, high=1e-1),
            ParamSpec(ent(a), "learning", "float", 0.0, f"agent {a} entropy bonus", low=0.0, high=0.05),
        )),
        ParamSpec(NUM_ROUNDS, "learning", "int", 2, "debate rounds", low=1, high=4),
        ParamSpec(SHAPING_ALPHA, "learning", "float", 0.2, "reward shaping alpha", low=0.0, high=1.0),
    ],
    constraints=list(toy.SPACE.constraints),
)


def simulate(config: dict, steps: int, stream: bool = False, memory_spike_gb: float = 0.0,
             kl_onset_step: int = 3) -> tuple[list[dict], str]:
    """The toy's system metrics (its rows with the shared lr/entropy knobs at their defaults), then each
    agent's learning metrics from its own knobs; the team's reward and score are the agents' mean."""
    single = {**config, toy.LR: 1e-3, toy.ENT: 0.0}
    rows, status = toy.simulate(single, steps, stream=stream, memory_spike_gb=memory_spike_gb)
    for row in rows[1:]:
        for key in ("actor/entropy", "critic/score/mean", "actor/grad_norm", "actor/ppo_kl"):
            row.pop(key, None)
    for step, row in enumerate(rows):
        if step == 0:
            continue
        qualities = []
        for a in AGENTS:
            a_lr = config[lr(a)]
            quality = 0.2 + 0.6 * (1 - math.exp(-step * a_lr * 100)) - (0.5 if a_lr > 0.02 else 0.0) * step / steps
            entropy = 1.0 if a_lr <= 0.02 or step <= 2 else 0.02
            row.update({agent_metric(a, "actor/entropy"): entropy, agent_metric(a, "critic/score/mean"): quality,
                        agent_metric(a, "actor/grad_norm"): 1.0, agent_metric(a, "actor/ppo_kl"): 0.01,
                        agent_metric(a, "actor/pg_loss"): 0.1, agent_metric(a, "reward_share"): 1 / len(AGENTS),
                        agent_metric(a, "copy_rate"): 0.2})
            qualities.append(quality)
        team = sum(qualities) / len(qualities)
        row["critic/score/mean"] = team
        row["workflow/answer_change_rate"] = 0.2
        if "val-core/toy/reward/mean@1" in row:
            row["val-core/toy/reward/mean@1"] = team
    return rows, status


class MultiAgentToyRunner(toy.ToyRunner):
    simulate = staticmethod(simulate)


class MultiAgentToyBackend(toy.ToyBackend):
    name = "toy-multi"

    def search_space(self) -> SearchSpace:
        return SPACE

    def base_config(self) -> dict:
        return {**SPACE.defaults(), **self.base_overrides}

    def make_runner(self) -> MultiAgentToyRunner:
        return MultiAgentToyRunner(stream=self.stream, memory_spike_gb=self.memory_spike_gb,
                                   kl_onset_step=self.kl_onset_step)


def make_backend(**options) -> MultiAgentToyBackend:
    return MultiAgentToyBackend(**options)
