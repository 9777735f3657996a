"""`--stages` and the schedule stage's options: parsed from the command line, validated by TuneOptions, and runs
stored before the option existed still load."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mart.state.options import TuneOptions
from tests.graph.test_cli_options import captured, run  # noqa: F401  (captured is a fixture)


def test_default_session_keeps_the_two_stages():
    o = TuneOptions()
    assert o.stages == ["system", "learning"]
    assert o.runs_stage("system") and o.runs_stage("learning") and not o.runs_stage("schedule")
    assert not TuneOptions(learning_trials=0).runs_stage("learning")


def test_old_stored_options_without_stages_still_load():
    stored = TuneOptions().model_dump(mode="json")
    for key in ("stages", "start_overrides", "schedule_segments", "schedule_branches", "schedule_budget",
                "schedule_horizon"):
        stored.pop(key)
    assert TuneOptions(**stored).stages == ["system", "learning"]


@pytest.mark.parametrize("value, stages", [
    ("system,learning,schedule", ["system", "learning", "schedule"]),
    ("schedule", ["schedule"]),
    (" system , schedule", ["system", "schedule"]),
])
def test_stages_flag_parses_comma_separated(captured, value, stages):  # noqa: F811
    out = run("tune", "--stages", value, "--schedule-segments", "4", "--schedule-branches", "2",
              "--schedule-budget", "9", "--schedule-horizon", "12", "--set", "actor_rollout_ref.actor.optim.lr=2e-4")
    assert out.exit_code == 0, out.output
    o = captured["options"]
    assert o.stages == stages
    assert (o.schedule_segments, o.schedule_branches, o.schedule_budget, o.schedule_horizon) == (4, 2, 9, 12)
    assert o.schedule_boundaries() == [3, 6, 9, 12]
    assert o.start_overrides == {"actor_rollout_ref.actor.optim.lr": 2e-4}


@pytest.mark.parametrize("value, words", [
    ("learning,system", "stages run in the order system,learning,schedule"),
    ("system,system", "a stage is named twice"),
    ("system,tuning", "Input should be 'system', 'learning' or 'schedule'"),
])
def test_bad_stages_are_refused_naming_the_flag(captured, value, words):  # noqa: F811
    out = run("tune", "--stages", value)
    assert out.exit_code == 2 and "options" not in captured
    text = " ".join(out.output.split())
    assert "--stages" in text and words in text, out.output


def test_schedule_defaults_and_bounds():
    o = TuneOptions(stages=["schedule"], learning_horizon=30)
    assert o.schedule_total_steps() == 30 and o.schedule_boundaries() == [10, 20, 30]
    assert o.schedule_trial_budget() == o.schedule_segments * o.schedule_branches == 9
    assert TuneOptions(stages=["schedule"], schedule_horizon=7, schedule_segments=3).schedule_boundaries() == [2, 5, 7]
    with pytest.raises(ValidationError, match="need a horizon of at least"):
        TuneOptions(stages=["schedule"], schedule_horizon=3, schedule_segments=4)
    with pytest.raises(ValidationError, match="greater than or equal to 2"):
        TuneOptions(schedule_branches=1)
