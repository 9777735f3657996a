"""verl checkpoints: the launch keys a branch and a saving trial get (verl 0.9.1's trainer.save_freq,
trainer.default_local_dir per trial, trainer.resume_mode=resume_path + resume_from_path), checked on the
argv the runner builds (no GPU here; docs/backends.md says what verl restores)."""

from __future__ import annotations

import sys
from pathlib import Path

from mart.state.trials import CheckpointRef, TrialSpec, checkpoint_dir
from mart.trial_runner.verl import VerlBackend, VerlRunner


def _runner_and_config() -> tuple[VerlRunner, dict]:
    backend = VerlBackend(entrypoint=f"{sys.executable} -c pass", base_config={"trainer.save_freq": 4},
                          prevalidate=False)
    runner = backend.make_runner()
    assert isinstance(runner, VerlRunner)
    return runner, backend.base_config()


def _args(argv: list[str]) -> dict[str, str]:
    return dict(a.lstrip("+").split("=", 1) for a in argv if "=" in a)


def test_a_saving_trial_and_a_branch_get_verls_checkpoint_keys(tmp_path: Path):
    runner, cfg = _runner_and_config()
    parent = TrialSpec(trial_id="p", config=cfg, steps=30, trial_dir=str(tmp_path / "p"), save_steps=[10, 20])
    argv = runner.build_command(parent)
    args = _args(argv)
    assert sum(a.lstrip("+").startswith("trainer.save_freq=") for a in argv) == 1, "one value per key"
    assert args["trainer.save_freq"] == "2"  # gcd of 10, 20 and the user's 4: every asked step is saved
    assert args["trainer.resume_mode"] == "disable"
    assert args["trainer.default_local_dir"] == str((tmp_path / "p" / "checkpoints").resolve())
    ckpt = checkpoint_dir(args["trainer.default_local_dir"], 10)
    assert ckpt.endswith("checkpoints/global_step_10")  # verl's folder naming

    branch = TrialSpec(trial_id="b", config={**cfg, "actor_rollout_ref.actor.optim.lr": 2e-6}, steps=30,
                       trial_dir=str(tmp_path / "b"), init_from=CheckpointRef(path=ckpt, step=10, trial_id="p"))
    args = _args(runner.build_command(branch))
    assert args["trainer.resume_mode"] == "resume_path" and args["trainer.resume_from_path"] == ckpt
    assert args["actor_rollout_ref.actor.checkpoint.load_contents"] == "[model,optimizer]"
    assert args["actor_rollout_ref.actor.optim.lr"] == "2e-06"
    assert args["trainer.total_training_steps"] == "30"  # the last global step, as for the local workload
    assert args["trainer.default_local_dir"] == str((tmp_path / "b" / "checkpoints").resolve())
