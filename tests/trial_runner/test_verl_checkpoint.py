"""verl checkpoints: the launch keys a branch and a saving trial get (verl 0.9.1's trainer.save_freq,
trainer.default_local_dir per trial, trainer.resume_mode=resume_path + resume_from_path), checked on the
argv the runner builds, and their effect on the stand-in, which saves and resumes as verl 0.9.1 does
(docs/backends.md says what verl restores; tests/trial_runner/test_verl_real_checkpoint.py runs verl's own loop)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mart.state.models import TrialStatus
from mart.state.search_space import ConfigError
from mart.state.trials import CheckpointRef, TrialSpec, checkpoint_dir
from mart.trial_runner.verl import VerlBackend, VerlRunner
from tests.support.paths import FAKE_VERL
from tests.support.trials import wait_finished


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


def test_a_branch_resumes_from_an_absolute_global_step_folder(tmp_path: Path, monkeypatch):
    """verl resolves a relative ``resume_from_path`` against its working directory (the branch's own trial dir)
    and reads the step from the folder's name: mart passes the parent's folder absolute, and refuses another."""
    runner, cfg = _runner_and_config()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "p" / "checkpoints" / "global_step_10").mkdir(parents=True)
    rel = "runs/p/checkpoints/global_step_10/"
    branch = TrialSpec(trial_id="b", config=cfg, steps=30, trial_dir=str(tmp_path / "b"),
                       init_from=CheckpointRef(path=rel, step=10, trial_id="p"))
    args = _args(runner.build_command(branch))
    assert args["trainer.resume_from_path"] == str(tmp_path / "runs" / "p" / "checkpoints" / "global_step_10")
    wrong = branch.model_copy(update={"init_from": CheckpointRef(path=str(tmp_path / "runs" / "p"), step=10)})
    with pytest.raises(ConfigError, match="global_step_10"):
        runner.build_command(wrong)


def _fake_backend() -> VerlBackend:
    return VerlBackend(entrypoint=f"{sys.executable} {FAKE_VERL}", prevalidate=False,
                       base_config={"fake.step_s": 0.0, "trainer.n_gpus_per_node": 2},
                       runner_options={"gpu_free_threshold_gb": None, "sample_gpu": False, "kill_grace_s": 1.0})


def test_the_stand_in_saves_and_resumes_as_verl_does(tmp_path: Path):
    """Through mart's runner: the parent's step-2 checkpoint in verl's layout where ``checkpoint_dir`` says, the
    branch resuming at global step 2 with its own lr reported, the first update at the parent's lr (torch's
    restored param groups; tests/trial_runner/test_verl_real_checkpoint.py shows it on verl's own loop)."""
    backend = _fake_backend()
    runner, cfg = backend.make_runner(), backend.base_config()
    lr = cfg["actor_rollout_ref.actor.optim.lr"]
    parent = TrialSpec(trial_id="p", config=cfg, steps=4, trial_dir=str(tmp_path / "p"), save_steps=[2],
                       stage="learning")
    assert wait_finished(runner, runner.launch(parent), 60).status == TrialStatus.COMPLETED
    folder = Path(checkpoint_dir(parent.trial_dir, 2))
    assert sorted(p.name for p in folder.iterdir()) == ["actor", "data.pt"]
    assert {p.name for p in (folder / "actor").iterdir()} == {
        f"{kind}_world_size_2_rank_{r}.pt" for kind in ("model", "optim", "extra_state") for r in (0, 1)
    } | {"fsdp_config.json", "huggingface"}
    assert (folder.parent / "latest_checkpointed_iteration.txt").read_text() == "4"
    branch = TrialSpec(trial_id="b", config={**cfg, "actor_rollout_ref.actor.optim.lr": 4 * lr}, steps=4,
                       trial_dir=str(tmp_path / "b"), init_from=CheckpointRef(path=str(folder), step=2, trial_id="p"),
                       stage="schedule")
    handle = runner.launch(branch)
    assert wait_finished(runner, handle, 60).status == TrialStatus.COMPLETED
    recs = {r.step: r.data for r in runner.read_all_metrics(handle)}
    assert sorted(recs) == [3, 4]
    assert [recs[s]["actor/lr"] for s in (3, 4)] == [4 * lr, 4 * lr]
    # the stand-in's KL grows with the lr the update used: the parent's at step 3, the branch's at step 4
    assert recs[3]["actor/ppo_kl"] == pytest.approx(0.0005 * 3 * lr / 1e-6)
    assert recs[4]["actor/ppo_kl"] == pytest.approx(0.0005 * 4 * 4 * lr / 1e-6)
    log = (tmp_path / "b" / "trial.log").read_text()
    assert f"Resuming from {folder}, setting global step to 2" in log


def test_the_stand_in_refuses_what_verl_refuses_on_resume(tmp_path: Path):
    """A checkpoint saved on 2 GPUs does not load on 4 (verl's shard names carry the world size); a fresh
    trial in a folder with checkpoints does not resume them (mart's resume_mode=disable)."""
    backend = _fake_backend()
    runner, cfg = backend.make_runner(), backend.base_config()
    parent = TrialSpec(trial_id="p", config=cfg, steps=2, trial_dir=str(tmp_path / "p"), save_steps=[2])
    assert wait_finished(runner, runner.launch(parent), 60).status == TrialStatus.COMPLETED
    again = wait_finished(runner, runner.launch(parent.model_copy(update={"save_steps": []})), 60)
    assert again.status == TrialStatus.COMPLETED and again.last_step == 2
    assert "Training from scratch" in (tmp_path / "p" / "trial.log").read_text()
    wider = TrialSpec(trial_id="w", config={**cfg, "trainer.n_gpus_per_node": 4}, steps=4,
                      trial_dir=str(tmp_path / "w"),
                      init_from=CheckpointRef(path=checkpoint_dir(parent.trial_dir, 2), step=2, trial_id="p"))
    poll = wait_finished(runner, runner.launch(wider), 60)
    assert poll.status == TrialStatus.FAILED and "model_world_size_4_rank_0.pt" in (poll.reason or "")
