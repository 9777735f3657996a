"""Checkpoints as trial outputs on the local workload: a branch starts from the saved weights (same
validation score at the branch point as the parent there), continues under its own knobs, and a branch
with the parent's knobs replays the parent exactly (weights, optimizer and data position all restored)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from mart.state.metrics import parse_line
from mart.state.models import TrialStatus
from mart.state.trials import CheckpointRef, TrialSpec, checkpoint_dir
from mart.trial_runner.local.backend import LocalBackend
from mart.trial_runner.local.checkpoint import CHECKPOINT_FILE
from mart.trial_runner.local.runner import LocalRunner

pytestmark = pytest.mark.timeout(240)

VAL = "val-core/digit_sort/reward/mean@1"
LR = "actor_rollout_ref.actor.optim.lr"
LEARNING = ("actor/entropy", "actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean", VAL)


def _run(runner: LocalRunner, spec: TrialSpec) -> dict[int, dict]:
    handle = runner.launch(spec)
    deadline = time.monotonic() + 180
    while not (poll := runner.poll(handle)).status.is_finished():
        assert time.monotonic() < deadline, "trial did not finish"
        time.sleep(0.1)
    log = Path(spec.trial_dir, "trial.log").read_text()
    assert poll.status is TrialStatus.COMPLETED, (poll, log[-2000:])
    lines = Path(spec.trial_dir, "metrics.jsonl").read_text().splitlines()
    return {rec.step: rec.data for rec in map(parse_line, lines)}


def test_branch_starts_from_the_saved_weights_and_continues_under_new_knobs(tmp_path, local_tiny_config):
    base = {**LocalBackend().base_config(), **local_tiny_config, "trainer.test_freq": 2}
    runner = LocalRunner()
    parent_dir = str(tmp_path / "parent")
    parent = _run(runner, TrialSpec(trial_id="parent", config=base, steps=8, trial_dir=parent_dir, save_steps=[4]))
    ckpt = checkpoint_dir(parent_dir, 4)
    assert Path(ckpt, CHECKPOINT_FILE).is_file()
    assert not list(Path(ckpt).glob("*.tmp")), "no half-written file is left behind"
    assert "timing_s/save_checkpoint" in parent[4]
    saved = torch.load(Path(ckpt, CHECKPOINT_FILE), weights_only=True)
    assert saved["step"] == 4 and saved["opt_step"] > 0 and saved["optimizer"]["state"], "optimizer moments saved"

    ref = CheckpointRef(path=ckpt, step=4, trial_id="parent")
    new_lr = 4 * base[LR]
    branch = _run(runner, TrialSpec(trial_id="branch", config={**base, LR: new_lr}, steps=8,
                                    trial_dir=str(tmp_path / "branch"), init_from=ref))
    # the branch's first record is its validation at the branch point: the parent's weights, same score
    assert min(branch) == 4 and sorted(branch) == [4, 5, 6, 7, 8]
    assert branch[4][VAL] == pytest.approx(parent[4][VAL], abs=1e-12)
    assert branch[4]["training/global_step"] == 4
    # ... and then trains under its own learning rate
    assert all(branch[s]["actor/lr"] == pytest.approx(new_lr) for s in range(5, 9))
    assert all(parent[s]["actor/lr"] == pytest.approx(base[LR]) for s in range(5, 9))
    assert branch[5]["actor/grad_norm"] != parent[5]["actor/grad_norm"] or branch[6][VAL] != parent[6][VAL]

    # unchanged knobs and seed: an exact replay of the parent's steps 5-8, so nothing was lost or reset
    # (weights, AdamW moments, the lr schedule's step, the prompt stream and the sampling stream)
    replay = _run(runner, TrialSpec(trial_id="replay", config=base, steps=8, trial_dir=str(tmp_path / "replay"),
                                    init_from=ref))
    for s in range(5, 9):
        for key in LEARNING:
            if key in parent[s]:
                assert replay[s][key] == pytest.approx(parent[s][key], rel=1e-5, abs=1e-7), (s, key)


def test_bad_branches_fail_with_a_clear_reason(tmp_path, local_tiny_config):
    base = {**LocalBackend().base_config(), **local_tiny_config}
    with pytest.raises(ValueError, match="init_from.step"):
        TrialSpec(trial_id="b", config=base, steps=4, trial_dir=str(tmp_path / "b"),
                  init_from=CheckpointRef(path=str(tmp_path), step=4))
    runner = LocalRunner()
    handle = runner.launch(TrialSpec(trial_id="missing", config=base, steps=6, trial_dir=str(tmp_path / "missing"),
                                     init_from=CheckpointRef(path=str(tmp_path / "nowhere"), step=2)))
    deadline = time.monotonic() + 120
    while not (poll := runner.poll(handle)).status.is_finished():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert poll.status is TrialStatus.FAILED and "no checkpoint" in (poll.reason or "")
