"""The job model under measurement noise (issue 43): the noise is estimated from the trials' own steps, and a
trial's residual is believed only as far as its noise allows."""

from __future__ import annotations

import math

import pytest

from mart.nodes.agents.job_model import JobModel, Observation, measurement_noise, shrunk_residuals
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


def _lucky_fit(jitter: float) -> tuple[JobModel, dict]:
    """Four trials of the synthetic job; the third one's rollout measured 8% faster than the job runs (luck), with
    step-to-step jitter ``jitter`` beside it."""
    truth = _Truth(job(), base_config())
    obs = [_observe(truth, ov) for ov in TRAIN_MOVES]
    lucky = obs[2]
    lucky.phases = {**lucky.phases, "gen": lucky.phases["gen"] * math.exp(-0.08)}
    rows = [{3: jitter, 4: -jitter}, {3: -jitter, 4: jitter}, {4: jitter, 5: -jitter}, {4: -jitter, 5: jitter}]
    for o, j in zip(obs, rows):
        _with_steps(o, j)
    return JobModel(job(), base_config()).fit(obs), {**base_config(), **TRAIN_MOVES[2]}


def test_a_lucky_trial_moves_the_model_only_as_far_as_its_noise_allows():
    exact, config = _lucky_fit(0.0)
    noisy, _ = _lucky_fit(0.12)  # a trial mean's noise of ~10%: the 8% luck is within it
    truth = _Truth(job(), base_config())
    true_gen, measured_gen = _observe(truth, TRAIN_MOVES[2]).phases["gen"], exact.predict(config).phase_s["gen"]
    assert measured_gen < 0.95 * true_gen  # without noise the model believes the measurement (exact there)
    noisy_gen = noisy.predict(config).phase_s["gen"]
    assert measured_gen < noisy_gen <= true_gen * 1.01  # under noise it keeps most of what the others measured
    assert noisy.cal.noise["gen"] > 0 and exact.cal.noise["gen"] == pytest.approx(0.0, abs=1e-12)
