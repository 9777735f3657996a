"""Simulated checkpoints: the learning state at a step, so a branch continues the parent's trajectory."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mart.state.trials import CheckpointRef, TrialSpec, checkpoint_dir
from mart.trial_runner.sim import SimBackend, SimRunner
from mart.trial_runner.sim import learning as L
from mart.trial_runner.sim.runner import CHECKPOINT_FILE
from mart.trial_runner.sim.scenarios import load_scenario

SC = "qwen3-0.6b-1x8"
LR = "actor_rollout_ref.actor.optim.lr"


def test_a_branch_with_the_same_knobs_continues_the_noise_free_trajectory():
    sc = load_scenario(SC)
    cfg = SimBackend(scenario=SC).base_config()
    whole = L.learning_trajectory(cfg, sc, 30, collapse_draw=1.0)
    head = L.learning_trajectory(cfg, sc, 12, collapse_draw=1.0)
    tail = L.learning_trajectory(cfg, sc, 30, collapse_draw=1.0, start=head.state_at(12))
    assert tail.first_step == 13 and tail.score0 == pytest.approx(whole.score[11])
    assert tail.score == pytest.approx(whole.score[12:]) and tail.entropy == pytest.approx(whole.entropy[12:])
    # new knobs take over from the branch point: a higher lr learns faster from the same state
    hot = L.learning_trajectory({**cfg, LR: 4 * cfg[LR]}, sc, 30, collapse_draw=math.inf, start=head.state_at(12))
    cold = L.learning_trajectory(cfg, sc, 30, collapse_draw=math.inf, start=head.state_at(12))
    assert hot.score[0] > cold.score[0]


def test_sim_runner_writes_checkpoints_as_the_clock_passes_and_branches_from_them(tmp_path: Path):
    backend = SimBackend(scenario=SC)
    runner = SimRunner(SC, clock="poll", steps_per_poll=1)
    cfg = backend.base_config()
    parent = TrialSpec(trial_id="p", config=cfg, steps=10, trial_dir=str(tmp_path / "p"), save_steps=[5])
    h = runner.launch(parent)
    ckpt = Path(checkpoint_dir(parent.trial_dir, 5))
    while not (p := runner.poll(h)).status.is_finished():
        if (p.last_step or 0) < 5:
            assert not (ckpt / CHECKPOINT_FILE).exists(), "a checkpoint appears only once its step is reached"
    state = json.loads((ckpt / CHECKPOINT_FILE).read_text())
    assert state["step"] == 5
    child = TrialSpec(trial_id="c", config={**cfg, LR: 2 * cfg[LR]}, steps=10, trial_dir=str(tmp_path / "c"),
                      init_from=CheckpointRef(path=str(ckpt), step=5, trial_id="p"))
    h = runner.launch(child)
    while not runner.poll(h).status.is_finished():
        pass
    recs = runner.read_all_metrics(h)
    assert [r.step for r in recs] == [5, 6, 7, 8, 9, 10]
    assert recs[1].data[LR.replace("actor_rollout_ref.actor.optim.", "actor/")] == pytest.approx(2 * cfg[LR])
    with pytest.raises(ValueError, match="no simulated checkpoint"):
        runner.launch(child.model_copy(update={"trial_id": "x", "trial_dir": str(tmp_path / "x"),
                                               "init_from": CheckpointRef(path=str(tmp_path), step=5)}))
