"""One record per knob: every table of knob facts outside the catalogue is derived from its records or agrees
with them, so a knob's facts change in one place (docs/architecture.md, "One record per knob").

Each test reads a table the way its user does (the job model, the simulator, the agents, the prompts) and
compares it with the catalogue records; renaming a key, moving a default or adding a modelled knob without its
counterpart makes one of them fail.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from mart.nodes.agents import job_model as JM
from mart.nodes.agents import prompts as P
from mart.nodes.agents.base import AgentContext
from mart.nodes.agents.feedback import parse_feedback
from mart.nodes.agents.knob_effects import knob_facts, reference_record
from mart.nodes.agents.rules import RulesProposer
from mart.nodes.agents.schedule import CAPACITY_KNOBS, RULES
from mart.state.agents import ASYNC_TASKS_PARAM, split_knob
from mart.state.models import HealthEvent, TrialRecord, TrialStatus
from mart.trial_runner.local.backend import LocalBackend
from mart.trial_runner.local.space import SEARCH_SPACE as LOCAL
from mart.trial_runner.local.space import team_search_space
from mart.trial_runner.marti.backend import MartiBackend
from mart.trial_runner.sim import learning as SL
from mart.trial_runner.sim import multi_agent as MA
from mart.trial_runner.sim.learning import LearningKnobs
from mart.trial_runner.sim.model import search_space as sim_space
from mart.trial_runner.sim.scenarios import load_scenario
from mart.trial_runner.sim.system import SYSTEM_KEYS, knobs_from_config
from mart.trial_runner.verl.focus import FOCUS
from mart.trial_runner.verl.space import SEARCH_SPACE as VERL
from mart.trial_runner.verl.space import VERL_DEFAULTS

MA_SCENARIO = "qwen2.5-3b-debate-2x2"


def catalogues() -> dict[str, object]:
    return {"verl": VERL, "local": LOCAL, "local-debate": team_search_space("debate", 2),
            "sim-debate": sim_space(MA_SCENARIO), "marti": MartiBackend().search_space()}


# -- the job model ------------------------------------------------------------------------------------------
def test_the_job_model_reads_every_modelled_knob_by_its_record():
    records = [p for p in (*VERL.params, ASYNC_TASKS_PARAM) if p.model]
    assert [p.model for p in records] == list(JM.KNOBS)
    for p in records:
        assert JM.KNOBS[p.model] == (p.key, p.default)
    # a config that leaves a knob out is read at the record's default (the model's fallback is the catalogue's)
    job = LocalBackend().describe_job().model_copy(update={"engine": "vllm"})
    job = job.model_copy(update={"hardware": job.hardware.model_copy(update={"cpu": False})})
    model = JM.JobModel(job, base_config={})
    full = {p.key: p.default for p in records}
    assert model.knobs({}) == model.knobs(full)


def test_every_modelled_knob_sits_on_one_side_of_the_step():
    sides = [*JM.ROLLOUT_KNOBS, *JM.TRAIN_KNOBS, *JM.SHARED_KNOBS]
    assert sorted(sides) == sorted(JM.KNOBS), "a knob the job model reads needs its side (rollout/train/shared)"


# -- the simulator (the world the tuner is benchmarked on: checked, not derived) ---------------------------------
def test_the_simulator_reads_every_modelled_verl_knob_at_verls_own_default():
    read = {key for key, _ in SYSTEM_KEYS.values()}
    modelled = {p.key for p in VERL.params if p.model}
    assert modelled <= read, f"the simulator does not model {sorted(modelled - read)}"
    assert read <= {p.key for p in VERL.params}, f"the simulator reads keys the catalogue lacks: {read - set(VERL._by_key)}"
    # a config that leaves a knob out runs at verl's default (null micro batches included), as verl would run it
    verl_default = {k: VERL_DEFAULTS[k] if k in VERL_DEFAULTS else VERL[k].default for k in read}
    assert knobs_from_config({}) == knobs_from_config(verl_default)


@pytest.mark.parametrize("scenario", ["qwen3-8b-1x8", "qwen3-0.6b-2x8"])
def test_the_simulators_learning_defaults_are_the_catalogues(scenario):
    sc = load_scenario(scenario)
    job_keys = {"actor_rollout_ref.rollout.n", "data.train_batch_size", "data.max_response_length"}  # the scenario's
    defaults = {p.key: p.default for p in VERL.stage_params("learning") if p.key not in job_keys}
    assert LearningKnobs.from_config({}, sc) == LearningKnobs.from_config(defaults, sc)


def test_the_simulator_models_every_choice_of_a_categorical_learning_knob():
    """The simulator's per-choice tables cover the catalogue's choices: a choice it lacks would fall back to a
    neutral factor silently, so the benchmark could not tell it from the default."""
    agg, kl = VERL["actor_rollout_ref.actor.loss_agg_mode"], VERL["actor_rollout_ref.actor.kl_loss_type"]
    for name in ("AGG_SCALE", "AGG_QUALITY", "AGG_LENGTH"):
        assert set(getattr(SL, name)) == set(agg.choices), f"sim.learning.{name} vs {agg.key}'s choices"
    assert set(SL.KL_TYPE_HAZARD) == set(kl.choices), f"sim.learning.KL_TYPE_HAZARD vs {kl.key}'s choices"


def test_the_multi_agent_catalogue_keeps_the_verl_records_facts():
    space = sim_space(MA_SCENARIO)
    copies = [p for p in space.params if split_knob(p.key)[1] in MA.PER_AGENT_KEYS]
    assert len(copies) == 2 * len(MA.PER_AGENT_KEYS)
    for p in copies:  # each agent's copy: verl's knob (its range and facts; the job's own value as its default)
        ref = VERL[split_knob(p.key)[1]]
        assert dataclasses.replace(p, key=ref.key, description="", default=None) == dataclasses.replace(
            ref, description="", default=None)
    assert set(MA.MA_FOCUS) <= {p.key for p in space.params}


# -- narrowed spaces, stage-3 rules and prompts name catalogue knobs -------------------------------------------
def test_the_focused_space_names_catalogue_knobs():
    assert set(FOCUS) <= {p.key for p in VERL.params}


def test_every_knob_a_stage3_transition_moves_is_a_learning_knob():
    """The transitions name verl's knobs by suffix (a backend without one skips that move)."""
    learning = [p.key for p in VERL.stage_params("learning")]
    named = {mv.suffix for rule in RULES for mv in rule.moves} | set(CAPACITY_KNOBS)
    for suffix in sorted(named):
        assert any(k == suffix or k.endswith("." + suffix) for k in learning), f"{suffix} is no verl learning knob"


def test_the_prompts_name_catalogue_knobs():
    last = {p.key.rsplit(".", 1)[-1] for p in VERL.params}
    named = set(re.findall(r"(?<![/\w])([a-z]+(?:_[a-z0-9]+)+)(?![\w/.])", P.VERL_PERF_GUIDE))
    assert named and named <= last, f"the perf guide names knobs the catalogue lacks: {sorted(named - last)}"
    team = {p.key for p in team_search_space("debate", 2).params} & {p.key for p in sim_space(MA_SCENARIO).params}
    dotted = set(re.findall(r"\b([a-z_]+\.[a-z_]+)\b", P.MULTI_AGENT_GUIDE))
    assert dotted and dotted <= team, f"the multi-agent guide names knobs the catalogues lack: {sorted(dotted - team)}"


# -- the agents read a knob's facts from its record, on every backend --------------------------------------------
def test_a_record_that_names_another_backends_knob_names_a_real_one():
    for name, space in catalogues().items():
        for p in space.params:
            if p.means is not None:
                assert reference_record(p.means) is not None, f"{name}: {p.key} means an unknown knob {p.means}"


def _meant(p) -> str:
    """The verl knob a record is (itself, a per-agent copy of one, or what its ``means`` names)."""
    ref = reference_record(p.means or p.key)
    return ref.key if ref is not None else p.key


@pytest.mark.parametrize("backend", ["verl", "local", "local-debate", "sim-debate", "marti"])
def test_every_alias_of_a_knob_reaches_that_knob(backend):
    """An alias reaches its knob; one several records share is one knob's (a shared knob and each agent's copy
    of it: the first, the shared one, wins), never two different knobs' (the reviewer's words would go to
    whichever comes first)."""
    space = catalogues()[backend]
    owners: dict[str, list] = {}
    for p in space.params:
        for alias in knob_facts(p).aliases:
            owners.setdefault(alias, []).append(p)
    assert owners
    for alias, records in owners.items():
        assert len({_meant(p) for p in records}) == 1, f"{alias!r} names different knobs: {[p.key for p in records]}"
        assert parse_feedback([f"raise the {alias}"], space).up == {records[0].key}, (alias, records[0].key)


@pytest.mark.parametrize("backend", ["verl", "local", "marti"])
def test_an_unstable_run_lowers_the_learning_rate_on_every_backend(backend):
    """The lr prior is the verl record's; MARTI's ``actor_learning_rate`` means that knob, so it gets it too."""
    space = catalogues()[backend]
    base = {"verl": VERL.defaults(), "local": LocalBackend().base_config(),
            "marti": MartiBackend().base_config()}[backend]
    lr = next(p for p in space.stage_params("learning") if knob_facts(p).prior == "lr")
    history = [TrialRecord(trial_id="b", stage="learning", kind="baseline", config=base, status=TrialStatus.COMPLETED,
                           score=0.5)]

    def top(events: list[HealthEvent]) -> dict:
        ctx = AgentContext(stage="learning", objective="x", search_space=space, base_config=base, best_overrides={},
                           profile=None, history=history, memory_limit_gb=None, predict_memory=lambda c: None,
                           num_candidates=3, health_events=events)
        return RulesProposer().propose(ctx)[0].overrides

    blowup = [HealthEvent(trial_id="b", step=5, rule="kl_blowup", severity="stop", message="x")]
    assert top(blowup).get(lr.key, base[lr.key]) < base[lr.key]
    assert top([]).get(lr.key, base[lr.key]) >= base[lr.key]


def test_the_docs_worked_example_is_one_record():
    """docs/architecture.md's example knob: its one record is all the agents, reviewers and prompts need."""
    from mart.state.search_space import ParamSpec, SearchSpace
    from tests.support.paths import REPO

    text = (REPO / "docs" / "architecture.md").read_text()
    code = text.split("**Worked example")[1].split("```python")[1].split("```")[0]
    spec = eval(code.strip().rstrip(","), {"_P": ParamSpec, "ACTOR": "actor_rollout_ref.actor"})  # noqa: S307 - our docs
    space = SearchSpace("verl", [*VERL.params, spec], list(VERL.constraints))
    assert space.edit_name(spec.key) == "clip_ratio_c" and space.resolve_key("clip_ratio_c") == spec.key
    assert parse_feedback(["raise the dual clip"], space).up == {spec.key}
    assert spec.key in space.describe("learning")
    base = space.defaults()
    ctx = AgentContext(stage="learning", objective="x", search_space=space, base_config=base, best_overrides={},
                       profile=None, history=[], memory_limit_gb=None, predict_memory=lambda c: None,
                       num_candidates=len(space.params) * 2)
    moves = {c.overrides[spec.key]: c.rationale for c in RulesProposer().propose(ctx) if spec.key in c.overrides}
    assert set(moves) == {4.7, 1.5} and all("lower clip bound" in why for why in moves.values())


@pytest.mark.parametrize("workflow,agents", [("debate", 2), ("debate", 3), ("chain", 2)])
def test_the_local_teams_search_ranges_lie_inside_the_valid_ranges(workflow, agents):
    """The team knobs' valid ranges live in ``team_config.TEAM_KEYS``; the search space may search a part of a
    range (what a CPU debate affords), never outside it, and its defaults are the valid table's."""
    from mart.trial_runner.local.team_config import TEAM_KEYS

    space = team_search_space(workflow, agents)
    checked = 0
    for p in space.params:
        if p.key not in TEAM_KEYS:
            continue
        default, _, _, low, high, choices = TEAM_KEYS[p.key]
        assert p.default == default, f"{p.key}: search default {p.default} != valid default {default}"
        if choices is not None:
            assert set(p.choices or ()) <= set(choices), f"{p.key}: searches choices outside {choices}"
        if low is not None:
            assert p.low is not None and p.low >= low, f"{p.key}: searches below its valid minimum {low}"
        if high is not None:
            assert p.high is not None and p.high <= high, f"{p.key}: searches above its valid maximum {high}"
        checked += 1
    assert checked >= 3
