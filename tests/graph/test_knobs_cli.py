"""``mart knobs``: the catalogue a reviewer edits, as a table or JSON."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from mart.graph.cli import app
from mart.trial_runner.local.space import SEARCH_SPACE


def test_knobs_json_lists_each_knob_with_its_edit_name_and_phase():
    res = CliRunner().invoke(app, ["knobs", "--backend", "local", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [r["key"] for r in rows] == [p.key for p in SEARCH_SPACE.params]
    by_key = {r["key"]: r for r in rows}
    mb = by_key["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"]
    assert mb["short"] == "micro_batch" and mb["phase"] == "update_actor" and mb["stage"] == "system"
    assert by_key["actor_rollout_ref.rollout.max_num_seqs"]["phase"] == "gen"
    assert by_key["actor_rollout_ref.actor.optim.lr"]["phase"] == "learning"


def test_knobs_by_stage_and_bad_input():
    res = CliRunner().invoke(app, ["knobs", "--backend", "sim", "--stage", "learning", "--json"])
    assert res.exit_code == 0 and {r["stage"] for r in json.loads(res.output)} == {"learning"}
    table = CliRunner().invoke(app, ["knobs", "--backend", "local"])
    assert table.exit_code == 0 and "micro_batch" in table.output and "why" in table.output
    bad = CliRunner().invoke(app, ["knobs", "--stage", "warmup"])
    assert bad.exit_code != 0 and "system or learning" in bad.output
    unknown = CliRunner().invoke(app, ["knobs", "--backend", "nosuch"])
    assert unknown.exit_code != 0
