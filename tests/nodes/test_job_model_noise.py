"""The job model under measurement noise (issue 43): the noise is estimated from the trials' own steps, a trial's
residual is believed only as far as its noise allows, and structural constants the noise cannot rule out make the
search optimistic about the configs they call faster."""

from __future__ import annotations

import math

import pytest

from mart.nodes.agents.job_model import JobModel, Observation, measurement_noise, shrunk_residuals
from mart.nodes.agents.model_search import search
from mart.trial_runner.verl.space import SEARCH_SPACE
from tests.nodes.test_job_model import TRAIN_MOVES, _observe, _Truth
from tests.support.jobs import base_config, job

STEPS = (3, 4, 5)
#: every trial's steps share this workload pattern (one seed: the same prompts), which is no noise
PATTERN = {3: 0.10, 4: -0.05, 5: 0.0}


def _with_steps(o: Observation, jitter: dict[int, float] | None = None) -> Observation:
    jitter = jitter or {}
    o.step_logs = {p: {j: math.log(t) + PATTERN[j] + jitter.get(j, 0.0) for j in STEPS} for p, t in o.phases.items()}
    return o


def test_the_noise_is_what_the_trials_do_not_share_step_by_step():
    truth = _Truth(job(), base_config())
    clean = [_with_steps(_observe(truth, ov)) for ov in TRAIN_MOVES[:3]]
    assert all(v == pytest.approx(0.0, abs=1e-12) for v in measurement_noise(clean).values())
    d = 0.05  # jitter whose rows and columns sum to zero: interaction sum of squares 4 d^2 over (3-1)(3-1) dof
    jitters = [{3: d, 4: -d}, {3: -d, 4: d}, {}]
    noisy = [_with_steps(_observe(truth, ov), j) for ov, j in zip(TRAIN_MOVES[:3], jitters)]
    assert measurement_noise(noisy)["gen"] == pytest.approx(d * d)


def test_a_residual_the_noise_explains_is_pulled_to_the_mean_and_a_clear_one_is_kept():
    k: dict[str, float] = {}
    pair = [(k, {"gen": 0.0}), (k, {"gen": -0.06})]
    # without noise the model stays exact at each measured config
    assert [r["gen"] for _, r in shrunk_residuals(pair, [3, 3], {"gen": 0.0})] == [0.0, -0.06]
    # a 6% difference with a trial mean's noise of 6% (one step's variance 3 x 0.06^2): one lucky trial
    pulled = [r["gen"] for _, r in shrunk_residuals(pair, [3, 3], {"gen": 3 * 0.06 ** 2})]
    assert pulled == pytest.approx([-0.03, -0.03])
    # a 50% difference is the model's error, not the noise: kept nearly whole
    clear = [r["gen"] for _, r in shrunk_residuals([(k, {"gen": 0.0}), (k, {"gen": -0.5})], [3, 3],
                                                    {"gen": 3 * 0.06 ** 2})]
    assert clear[1] - clear[0] == pytest.approx(-0.5, rel=0.05)


def _fitted(jitter: float) -> JobModel:
    truth = _Truth(job(), base_config())
    rows = [{3: jitter, 4: -jitter}, {3: -jitter, 4: jitter}, {4: jitter, 5: -jitter}, {4: -jitter, 5: jitter}]
    obs = [_with_steps(_observe(truth, ov), j) for ov, j in zip(TRAIN_MOVES, rows)]
    return JobModel(job(), base_config()).fit(obs)


def test_noise_keeps_other_structural_constants_plausible_and_the_search_optimistic():
    clean, noisy = _fitted(0.0), _fitted(0.15)
    assert clean.cal.plausible == [] and clean.alternatives() == []
    assert noisy.cal.plausible and len(noisy.alternatives()) == len(noisy.cal.plausible)
    assert all((a.cal.step_overhead_mult, a.cal.knee_mult, a.cal.comm_mult) != (
        noisy.cal.step_overhead_mult, noisy.cal.knee_mult, noisy.cal.comm_mult) for a in noisy.alternatives())
    found = search(noisy, SEARCH_SPACE, base_config(), 0.9 * job().hardware.memory_gb, n_out=8)
    assert found and all(s.optimistic >= s.throughput for s in found)
    assert any(s.optimistic > s.throughput for s in found)
    # without noise the search ranks by the fit alone, as before
    assert all(s.optimistic == s.throughput for s in search(clean, SEARCH_SPACE, base_config(),
                                                            0.9 * job().hardware.memory_gb, n_out=8))
