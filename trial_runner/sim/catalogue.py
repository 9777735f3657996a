"""The knobs a simulated job exposes and the baseline it starts from (its catalogue).

A single-agent scenario's catalogue is verl's (``mart.trial_runner.verl.space``); a multi-agent one's is
verl's with the per-agent learning knobs split per agent (``agents.<i>.<verl key>``) plus the workflow,
shaping and async knobs (``mart.state.agents``). ``base_config`` is every stage's baseline: the catalogue's
defaults, the scenario's job shape and the keys the user's job sets. The scenario loader checks a job's
baseline against these rules, and the simulator's trial models read them, so this module sits between the
two (it knows the scenario types of ``job`` and nothing else of the simulator).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

from mart.state.agents import (
    ASYNC_TASKS,
    ASYNC_TASKS_PARAM,
    HISTORY_SCOPE,
    NUM_ROUNDS,
    NUM_ROUNDS_PARAM,
    SHAPING_ALPHA,
    SHAPING_MODE,
)
from mart.state.search_space import Constraint, ParamSpec, SearchSpace
from mart.state.verl_keys import ACTOR as A
from mart.state.verl_keys import ROLLOUT as R
from mart.trial_runner.sim.job import MultiAgentScenario, Scenario, is_multi_agent

#: the verl learning knobs every agent sets for itself (MARTI: each agent's JSON config); the others are shared
PER_AGENT_KEYS: tuple[str, ...] = (A + "optim.lr", A + "use_kl_loss", A + "kl_loss_coef", A + "entropy_coeff",
                                   A + "clip_ratio_high", R + "temperature")
# the multi-agent knobs' names (mart.state.agents, where every layer reads them)
ROUNDS_KEY = NUM_ROUNDS
SHAPING_MODE_KEY = SHAPING_MODE
SHAPING_ALPHA_KEY = SHAPING_ALPHA
HISTORY_SCOPE_KEY = HISTORY_SCOPE
ASYNC_KEY = ASYNC_TASKS
SHAPING_MODES = ("none", "margin", "quality")
HISTORY_SCOPES = ("step", "window", "all")

_AGENT_RE = re.compile(r"^agents\.(\d+)\.(.+)$")


def agent_key(i: int, key: str) -> str:
    """The per-agent form of a verl key: ``agents.<i>.<key>``."""
    return f"agents.{i}.{key}"


def agent_config(config: dict[str, Any], i: int) -> dict[str, Any]:
    """Agent ``i``'s own flat verl config: the shared keys with its ``agents.<i>.*`` keys on top."""
    out = {k: v for k, v in config.items() if not k.startswith("agents.")}
    prefix = f"agents.{i}."
    out.update({k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix)})
    return out



def search_space(sc: Scenario | None = None) -> SearchSpace:
    """verl's catalogue; a multi-agent scenario's own (per-agent and workflow knobs) when given one."""
    if sc is not None and is_multi_agent(sc):
        return agent_space(sc)  # type: ignore[arg-type]
    from mart.trial_runner.verl.space import SEARCH_SPACE

    return SEARCH_SPACE


def base_config(sc: Scenario) -> dict[str, Any]:
    """verl's defaults (the catalogue's) plus the scenario's job shape: the baseline of every stage."""
    cfg = dict(search_space().defaults())
    cfg.update(
        {
            "algorithm.adv_estimator": "grpo",
            "actor_rollout_ref.model.path": sc.model.hf_path,
            "actor_rollout_ref.rollout.name": "vllm",
            "trainer.n_gpus_per_node": sc.gpus_per_node,
            "trainer.nnodes": sc.nnodes,
            "trainer.test_freq": sc.test_freq,
            "trainer.val_before_train": True,
            "data.train_batch_size": sc.train_batch_size,
            "data.max_prompt_length": sc.max_prompt_length,
            "data.max_response_length": sc.max_response_length,
            "actor_rollout_ref.rollout.n": sc.rollout_n,
            "data.train_files": "math/train.parquet",
            "data.val_files": "math/test.parquet",
        }
    )
    cfg.update(dict(sc.base_overrides))  # the verl keys the user's job sets
    if is_multi_agent(sc):  # per-agent knobs split per agent, workflow knobs at their defaults
        return _agent_base_config(sc, cfg)  # type: ignore[arg-type]
    return cfg


def learning_part(config: dict[str, Any]) -> dict[str, Any]:
    """The stage-2 (learning) knobs of a flat verl config: what seeds a trial's learning noise."""
    space = search_space()
    keys = {p.key for p in space.stage_params("learning")}
    return {k: v for k, v in config.items() if k in keys}


# ------------------------------------------------------------------------------------------ multi-agent
#: the multi-agent knobs' focused ranges (the restricted baselines' space; FOCUS for the verl ones)
MA_FOCUS: dict[str, tuple[float, float] | None] = {
    ASYNC_KEY: (0, 1024), ROUNDS_KEY: None, SHAPING_MODE_KEY: None, SHAPING_ALPHA_KEY: (0.05, 1.0),
    HISTORY_SCOPE_KEY: None,
}


def _ma_params(workflow: str, num_rounds: int) -> list[ParamSpec]:
    out = [ASYNC_TASKS_PARAM]
    if workflow == "debate":
        out.append(dataclasses.replace(NUM_ROUNDS_PARAM, default=num_rounds))
    out += [
        ParamSpec(SHAPING_MODE_KEY, "learning", "categorical", "none",
                  "per-agent reward shaping R + alpha*Delta: margin (R - Q) or quality (Q*R - (1-Q)(1-R)); none = "
                  "every agent gets the team reward", choices=SHAPING_MODES),
        ParamSpec(SHAPING_ALPHA_KEY, "learning", "float", 0.5, "shaping weight alpha", low=0.0, high=2.0),
        ParamSpec(HISTORY_SCOPE_KEY, "learning", "categorical", "all",
                  "history Q is averaged over: this step, a window of recent steps, or the whole run", choices=HISTORY_SCOPES),
    ]
    return out


def _agent_param(p: ParamSpec, i: int) -> ParamSpec:
    return dataclasses.replace(p, key=agent_key(i, p.key), description=f"agent {i}: {p.description}")


def _per_agent_constraint(c: Constraint, n: int) -> Constraint:
    def check(config: dict[str, Any]) -> str | None:
        for i in range(n):
            msg = c.check(agent_config(config, i))
            if msg:
                return msg if n == 1 else f"agent {i}: {msg}"
        return None

    return Constraint(c.name, c.description, check)


def _async_constraint(n_gpus_agent: int, rollout_n: int) -> Constraint:
    def check(config: dict[str, Any]) -> str | None:
        c = int(config.get(ASYNC_KEY, 0) or 0)
        tp = int(config.get(R + "tensor_model_parallel_size", 2) or 2)
        n = int(config.get(R + "n", rollout_n) or 1)
        engines = max(1, n_gpus_agent // max(tp, 1))
        if 0 < c * n < engines:
            return f"{c} async tasks x {n} samples leave some of the {engines} vLLM engines of an agent idle"
        return None

    return Constraint("async_tasks_feed_engines", "async tasks x rollout.n >= vLLM engines per agent (or 0 = sync)", check)


@functools.lru_cache(maxsize=8)
def _search_space(n: int, workflow: str, num_rounds: int, n_gpus_agent: int, rollout_n: int,
                  base: tuple[tuple[str, Any], ...] = ()) -> SearchSpace:
    from mart.trial_runner.verl.space import SEARCH_SPACE

    job = dict(base)

    def own(p: ParamSpec, key: str) -> ParamSpec:  # the job's own value is the knob's default (its baseline)
        return dataclasses.replace(p, default=p.validate(job[key])) if key in job else p

    params = [own(p, p.key) for p in SEARCH_SPACE.params if p.key not in PER_AGENT_KEYS]
    for i in range(n):
        params += [_agent_param(own(SEARCH_SPACE[k], k), i) for k in PER_AGENT_KEYS]
    params += _ma_params(workflow, num_rounds)
    constraints = [_per_agent_constraint(c, n) for c in SEARCH_SPACE.constraints]
    return SearchSpace(backend="verl-multi-agent", params=params,
                       constraints=[*constraints, _async_constraint(n_gpus_agent, rollout_n)])


def agent_space(sc: MultiAgentScenario) -> SearchSpace:
    """verl's catalogue with the per-agent knobs split per agent, plus the workflow/shaping/async knobs;
    a knob the job's file sets has that value as its default (the baseline the focused space keeps).

    Constraints: verl's rules hold for every agent's own config; async tasks must feed every engine.
    """
    return _search_space(sc.num_agents, sc.workflow, sc.num_rounds, sc.n_gpus_agent, sc.rollout_n, sc.base_overrides)


def focus_space(space: SearchSpace) -> SearchSpace:
    """The focused space of a multi-agent catalogue: verl's FOCUS knobs (per agent where they are per
    agent) and the multi-agent knobs over ``MA_FOCUS`` ranges; the same constraints."""
    from mart.trial_runner.verl.focus import FOCUS, narrowed

    params = []
    for p in space.params:
        m = _AGENT_RE.match(p.key)
        base = m.group(2) if m else p.key
        if base in FOCUS:
            rng = FOCUS[base]
        elif p.key in MA_FOCUS:
            rng = MA_FOCUS[p.key]
        else:
            continue
        params.append(narrowed(p, rng))
    return SearchSpace(backend=f"{space.backend}-focus", params=params, constraints=list(space.constraints))


def _agent_base_config(sc: MultiAgentScenario, single: dict[str, Any]) -> dict[str, Any]:
    """The single-agent baseline (``single``: verl defaults + job shape) with the per-agent knobs split
    per agent and the multi-agent knobs at their defaults."""
    space = agent_space(sc)
    cfg = {k: v for k, v in single.items() if k not in PER_AGENT_KEYS}
    for i in range(sc.num_agents):
        for k in PER_AGENT_KEYS:
            cfg[agent_key(i, k)] = single.get(k, space[agent_key(i, k)].default)
    for p in _ma_params(sc.workflow, sc.num_rounds):
        cfg.setdefault(p.key, p.default)
    return cfg

