"""mart's verl runner against verl 0.9.1's own trainer loop on the CPU (``tests/support/verl_cpu_trainer.py``:
verl's Hydra parsing, ``validate_config``, ``PPOTrainer.fit``, ``Tracking``, ``_save_checkpoint`` /
``_load_checkpoint`` and the FSDP checkpoint manager; only rollout and update are a tiny model). Needs the verl
extra; skipped otherwise.

What verl itself must do with mart's argv: save ``global_step_N/`` where mart expects it, resume a branch from the
parent's checkpoint (weights, optimizer, data position, global step), apply the branch's learning rate, never
resume a fresh trial silently, and log records mart reads back from both of its outputs.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl extra not installed: pip install .[verl]")

from mart.state.models import TrialStatus
from mart.state.trials import CheckpointRef, TrialSpec, checkpoint_dir
from mart.trial_runner.verl import VerlBackend
from mart.trial_runner.verl.logs import ConsoleMetricsTail
from mart.trial_runner.verl.prevalidate import compose_and_validate
from tests.support.paths import REPO
from tests.support.trials import wait_finished

pytestmark = [pytest.mark.verl, pytest.mark.timeout(600)]

HARNESS = REPO / "tests" / "support" / "verl_cpu_trainer.py"
LR = 0.01
BASE = {  # one CPU "GPU": batch arithmetic that verl's validate_config accepts
    "trainer.n_gpus_per_node": 1, "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "data.train_batch_size": 8, "actor_rollout_ref.rollout.n": 4, "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4, "actor_rollout_ref.actor.optim.lr": LR,
}
SCORE = "val-core/openai/gsm8k/reward/mean@1"
LEARNING = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/advantages/mean")
ACTOR_FILES = {"model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt", "extra_state_world_size_1_rank_0.pt",
               "fsdp_config.json", "huggingface"}


def _backend() -> VerlBackend:
    return VerlBackend(entrypoint=f"{sys.executable} {HARNESS}", base_config=BASE, prevalidate=False,
                       runner_options={"gpu_free_threshold_gb": None, "sample_gpu": False, "kill_grace_s": 2.0})


def _run(runner, spec: TrialSpec):
    handle = runner.launch(spec)
    poll = wait_finished(runner, handle, timeout_s=240.0, every_s=0.2)
    log = (Path(spec.trial_dir) / "trial.log").read_text(errors="replace")
    assert poll.status == TrialStatus.COMPLETED, (poll, log[-4000:])
    return handle, {r.step: r.data for r in runner.read_all_metrics(handle)}


@pytest.fixture(scope="module")
def trials(tmp_path_factory):
    """A parent saving at step 2 (horizon 4), then from its step-2 checkpoint the unchanged continuation and a
    branch with a 10x smaller learning rate: three real runs of verl's loop (~15 s each)."""
    root = tmp_path_factory.mktemp("verl-cpu")
    backend = _backend()
    runner = backend.make_runner()
    cfg = backend.base_config()
    parent = TrialSpec(trial_id="parent", config=cfg, steps=4, trial_dir=str(root / "parent"), save_steps=[2],
                       stage="learning")
    out = {"runner": runner, "backend": backend, "parent": parent, "cfg": cfg}
    out["parent_handle"], out["parent_recs"] = _run(runner, parent)
    ckpt = CheckpointRef(path=checkpoint_dir(parent.trial_dir, 2), step=2, trial_id="parent")
    cont = TrialSpec(trial_id="cont", config=cfg, steps=4, trial_dir=str(root / "cont"), init_from=ckpt,
                     stage="schedule")
    low = TrialSpec(trial_id="low-lr", config={**cfg, "actor_rollout_ref.actor.optim.lr": LR / 10}, steps=4,
                    trial_dir=str(root / "low-lr"), init_from=ckpt, stage="schedule")
    out["cont"], out["low"] = cont, low
    _, out["cont_recs"] = _run(runner, cont)
    _, out["low_recs"] = _run(runner, low)
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_verl_writes_the_checkpoints_mart_points_branches_at(trials):
    """mart asks for step 2 (save_freq = 2); verl also saves at the last step. The folders are where
    ``checkpoint_dir`` says, with verl's files, and verl's own tracker finds the newest."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    trial_dir = Path(trials["parent"].trial_dir)
    root = trial_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["global_step_2", "global_step_4",
                                                      "latest_checkpointed_iteration.txt"]
    for step in (2, 4):
        folder = Path(checkpoint_dir(str(trial_dir), step))
        assert folder.parent == root and sorted(p.name for p in folder.iterdir()) == ["actor", "data.pt"]
        assert {p.name for p in (folder / "actor").iterdir()} == ACTOR_FILES
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "4"
    assert find_latest_ckpt_path(str(root)) == checkpoint_dir(str(trial_dir), 4)
    recs = trials["parent_recs"]
    assert sorted(recs) == [1, 2, 3, 4]  # learning stage: no step-0 validation unless the config asks for it
    assert [s for s in recs if "timing_s/save_checkpoint" in recs[s]] == [2, 4]
    assert [s for s in recs if SCORE in recs[s]] == [4]  # the trial's score: a validation at its horizon


def test_the_unchanged_continuation_replays_the_parent(trials):
    """verl restores weights, optimizer state, data position and global step from mart's resume keys: the
    continuation's steps 3-4 are the parent's, number for number (rollout sampling is seeded per step here, as
    vLLM's is not in a checkpoint)."""
    parent, cont = trials["parent_recs"], trials["cont_recs"]
    assert sorted(cont) == [3, 4] and cont[3]["training/global_step"] == 3
    for step in (3, 4):
        for key in LEARNING:
            assert _same(cont[step][key], parent[step][key]), (step, key, cont[step][key], parent[step][key])
    assert cont[4][SCORE] == parent[4][SCORE]
    log = (Path(trials["cont"].trial_dir) / "trial.log").read_text()
    assert "resumed at global step 2" in log


def test_a_branch_gets_its_own_learning_rate_one_step_late(trials):
    """With ``checkpoint.load_contents=[model,optimizer]`` (mart's) the scheduler restarts at the branch's lr, so
    verl reports it from the first branch step; the optimizer's restored param groups still carry the parent's
    lr into that first update (``cpu/lr_applied``), verl's own behaviour, documented in docs/backends.md.
    Restoring ``extra`` too would keep the parent's lr for the whole branch."""
    low = trials["low_recs"]
    assert [low[s]["actor/lr"] for s in (3, 4)] == [LR / 10, LR / 10]
    assert [low[s]["cpu/lr_applied"] for s in (3, 4)] == [LR, LR / 10]
    parent = trials["parent_recs"]
    assert low[3]["critic/score/mean"] == parent[3]["critic/score/mean"]  # same weights and prompts at step 3


def test_both_outputs_of_verls_logger_read_back_the_same(trials):
    """The runner's records (verl's file logger) equal the JSON lines read with the standard library, and the
    console lines in trial.log (verl's LocalLogger, a tqdm bar on the same stream) carry the same values."""
    handle = trials["parent_handle"]
    raw = {}
    for line in Path(handle.extra["metrics_path"]).read_text().splitlines():
        obj = json.loads(line)
        raw[obj["step"]] = {k: math.nan if v is None else float(v) for k, v in obj["data"].items()}
    recs = trials["parent_recs"]
    assert raw.keys() == recs.keys()
    console = {r.step: r.data for r in ConsoleMetricsTail(Path(handle.trial_dir) / "trial.log").read_new(final=True)}
    assert console.keys() == recs.keys()
    for step, data in recs.items():
        assert data.keys() == raw[step].keys() == console[step].keys(), step
        assert all(_same(data[k], raw[step][k]) and _same(data[k], console[step][k]) for k in data), step


def test_a_relaunched_trial_never_resumes_its_own_old_checkpoints(trials):
    """verl's default ``resume_mode=auto`` would resume ``default_local_dir``'s newest checkpoint: a second
    attempt of the parent (same trial dir, its checkpoints still there) must start from the base model."""
    runner, parent = trials["runner"], trials["parent"]
    again = parent.model_copy(update={"steps": 2, "save_steps": []})
    handle, recs = _run(runner, again)
    assert handle.extra["attempt"] == 2
    assert sorted(recs) == [1, 2]
    for key in LEARNING:
        assert _same(recs[1][key], trials["parent_recs"][1][key]), key


def test_a_branchs_whole_command_line_composes_and_validates_in_verl(trials):
    """Every key mart puts on a branch's argv (candidate and run keys) exists in verl's schema with the value
    mart meant, and verl's validate_config accepts the result."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mart.trial_runner.verl.prevalidate import _config_dir

    runner, spec = trials["runner"], trials["low"]
    entry = len(runner.entrypoint)
    argv = runner.build_command(spec.model_copy(update={"trial_dir": spec.trial_dir + "-argv"}))[entry:]
    assert compose_and_validate(argv) == []
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=_config_dir(), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=[a for a in argv if not a.startswith("hydra.")])
    GlobalHydra.instance().clear()
    assert cfg.trainer.resume_mode == "resume_path"
    assert cfg.trainer.resume_from_path == spec.init_from.path and "global_step_" in cfg.trainer.resume_from_path
    assert int(cfg.trainer.resume_from_path.split("global_step_")[-1]) == spec.init_from.step  # verl's own parse
    assert list(cfg.actor_rollout_ref.actor.checkpoint.load_contents) == ["model", "optimizer"]
    assert cfg.trainer.default_local_dir == str(Path(spec.trial_dir + "-argv").resolve() / "checkpoints")
    assert cfg.actor_rollout_ref.actor.optim.lr == LR / 10 and cfg.trainer.total_training_steps == 4


def test_the_stand_in_keeps_verls_checkpoint_layout(trials, tmp_path):
    """tests/support/fake_verl (what the main suite's verl schedule sessions run against) writes the same files
    as verl's own code for the same argv, and resumes at the same global step."""
    from tests.support.paths import FAKE_VERL

    fake = VerlBackend(entrypoint=f"{sys.executable} {FAKE_VERL}", prevalidate=False,
                       base_config={**BASE, "fake.step_s": 0.0, "fake.params_b": 0.5},
                       runner_options={"gpu_free_threshold_gb": None, "sample_gpu": False})
    runner = fake.make_runner()
    spec = trials["parent"].model_copy(update={"trial_dir": str(tmp_path / "fake-parent"),
                                               "config": fake.base_config()})
    _run(runner, spec)

    def files(trial_dir: str) -> set[str]:
        root = Path(trial_dir) / "checkpoints"
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}

    assert files(spec.trial_dir) == files(trials["parent"].trial_dir)
    branch = trials["cont"].model_copy(update={
        "trial_dir": str(tmp_path / "fake-cont"), "config": fake.base_config(),
        "init_from": CheckpointRef(path=checkpoint_dir(spec.trial_dir, 2), step=2, trial_id="fake-parent")})
    _, recs = _run(runner, branch)
    assert sorted(recs) == sorted(trials["cont_recs"]) == [3, 4]
