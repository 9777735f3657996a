"""The job model on a multi-agent (team) job: every agent's static memory on the device, one activation peak."""

from __future__ import annotations

import pytest

from mart.nodes.agents.job_model import JobModel, Observation
from mart.state.job import JobDescription
from mart.state.objectives import memory_limit_gb
from mart.state.options import TuneOptions
from mart.trial_runner.local.backend import LocalBackend
from mart.trial_runner.local.memory import static_agent_gb
from mart.trial_runner.local.team_config import load_team_config

A, R, M = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.model."
CONFIGS = [
    {},
    {A + "ppo_micro_batch_size_per_gpu": 2},
    {M + "enable_gradient_checkpointing": False, R + "max_num_seqs": 128},
    {A + "use_dynamic_bsz": True, A + "ppo_max_token_len_per_gpu": 3072},
    {A + "use_kl_loss": False},
]
# the first stage-1 candidate of the default debate session, measured: oom (0.091 GB > 0.086 GB) while the
# baseline peaked at 0.0393 GB (mart tune --backend local --backend-option workflow=debate --approve auto)
OOM_CANDIDATE = {A + "ppo_max_token_len_per_gpu": 3072, A + "use_dynamic_bsz": True,
                 M + "enable_gradient_checkpointing": False, R + "max_num_seqs": 128}
BASELINE_PEAK_GB = 0.0393


def _single(backend: LocalBackend) -> JobDescription:
    return backend.describe_job().model_copy(update={"agents": 1})


@pytest.mark.parametrize("agents", [2, 3])
def test_a_team_adds_each_further_agents_static_memory_as_the_workload_counts_it(agents):
    backend = LocalBackend(workflow="debate", agents=agents)
    job = backend.describe_job()
    assert job.agents == agents and job.resident_policies == agents
    base = backend.base_config()
    team, single = JobModel(job, base), JobModel(_single(backend), base)
    for overrides in CONFIGS:
        cfg = {**base, **overrides}
        expected = (agents - 1) * static_agent_gb(load_team_config(cfg).base)
        added = team.predict(cfg).peak_gb - single.predict(cfg).peak_gb
        # the static terms are exact byte counts: the same as the workload's own estimate within 2%
        assert added == pytest.approx(expected, rel=0.02), overrides
        # and every phase carries them (the agents' weights and optimizer state never leave the device)
        for phase, gb in team.predict(cfg).phase_gb.items():
            if gb > 0:
                assert gb - single.predict(cfg).phase_gb[phase] == pytest.approx(expected, rel=0.02), phase


def test_agents_that_own_their_devices_cost_one_agents_memory():
    backend = LocalBackend(workflow="chain", agents=3)
    owned = backend.describe_job().model_copy(update={"agents_per_device": 1})
    base = backend.base_config()
    assert JobModel(owned, base).predict({}).peak_gb == pytest.approx(JobModel(_single(backend), base).predict({}).peak_gb)
    with pytest.raises(ValueError, match="agents_per_device"):
        JobDescription(**{**backend.describe_job().model_dump(), "agents_per_device": 4})


def test_an_oom_on_an_emulated_device_does_not_condemn_every_candidate():
    """The default debate session's stage 1: after the first candidate's OOM the calibrated model predicted
    every further candidate at the limit (an absolute 0.1 GB peak noise, larger than the whole emulated
    device, let the OOM lift every phase's bias) and the critic rejected them all for three rounds."""
    backend = LocalBackend(workflow="debate")
    # the team workload of that session (8 prompts a step then; 4 by default now)
    base = {**backend.base_config(), "data.train_batch_size": 8, A + "ppo_mini_batch_size": 8}
    limit = memory_limit_gb(backend.memory_capacity_gb(), TuneOptions().memory_margin)
    job = backend.describe_job().model_copy(update={"workload": backend.describe_job().workload.model_copy(
        update={"train_batch_size": 8})})
    model = JobModel(job, base).fit([
        # response lengths as measured in that baseline (updates 3-5)
        Observation(config=base, phases={}, peak_gb=BASELINE_PEAK_GB, resp_mean=8.05, resp_max=16.0, prompt_mean=12.2),
        Observation(config={**base, **OOM_CANDIDATE}, phases={}, peak_gb=None, oom=True),
    ])
    # the measured baseline is reproduced within the model's own safety gap, the OOM config stays over
    assert abs(model.predict(base).peak_gb - BASELINE_PEAK_GB) <= model.base_gap_gb()
    assert model.predict({**base, **OOM_CANDIDATE}).peak_gb > limit
    # the candidates the critic rejected then (micro batch, token cap) change little memory: they fit
    for overrides in ({A + "ppo_micro_batch_size_per_gpu": 2}, {A + "ppo_micro_batch_size_per_gpu": 8},
                      {A + "ppo_max_token_len_per_gpu": 512}):
        pred = model.predict({**base, **overrides}).peak_gb
        assert pred < limit, overrides
        assert abs(pred - BASELINE_PEAK_GB) < 0.25 * limit, overrides
