"""verl 0.9.1's own ``Tracking`` logger (console + file backends) writes step records; mart's readers get back
exactly what was logged (the real formats, not a copy of them). Needs the verl extra; skipped otherwise.

The oracle is the Python dict handed to ``Tracking.log``: a number reads back as ``float(v)`` (a float32 as its
shortest decimal, which is what both backends print), a non-finite one as NaN (the file backend writes it as
``null``), anything else not at all; verl's console prints ``numbers.Number`` values only.
"""

from __future__ import annotations

import math
import numbers

import pytest

pytest.importorskip("verl", reason="verl extra not installed: pip install .[verl]")

import numpy as np

from mart.trial_runner.metrics import MetricsTail
from mart.trial_runner.verl.logs import ConsoleMetricsTail, FallbackMetricsTail

pytestmark = [pytest.mark.verl, pytest.mark.timeout(300)]

STEPS = {
    0: {"val-core/openai/gsm8k/reward/mean@1": np.float64(0.3125)},
    1: {"actor/entropy": np.float64(1.25), "actor/lr": 1e-06, "perf/throughput": 1234.5678901234, "training/global_step": 1,
        "perf/total_num_tokens": np.int64(2**40), "actor/pg_clipfrac": np.float32(0.1), "critic/score/mean": 0.0,
        "timing_s/step": 3.0000000000000004, "actor/kl_loss": -2.5e-310},
    2: {"actor/grad_norm": float("nan"), "actor/pg_loss": np.float64("nan"), "actor/ppo_kl": float("inf"),
        "actor/entropy": -float("inf"), "perf/max_memory_allocated_gb": np.float32("inf"), "training/global_step": 2},
    3: {"actor/entropy": 0.5, "note": "a string", "data/ids": [1, 2], "flag/bool": True, "flag/np_bool": np.bool_(False),
        "training/global_step": 3},
}


def expected(data: dict, route: str) -> dict[str, float]:
    out = {}
    for k, v in data.items():
        if route == "console" and not isinstance(v, numbers.Number):
            continue  # verl's LocalLogger prints numbers only
        if isinstance(v, (str, list, dict)):
            continue
        f = float(str(v)) if isinstance(v, np.float32) else float(v)
        out[k] = f if math.isfinite(f) else math.nan
    return out


def same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all((math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a)


def test_tracking_console_and_file_records_read_back_exactly(tmp_path, monkeypatch, capfd):
    from verl.utils.tracking import Tracking

    jsonl, log = tmp_path / "metrics.jsonl", tmp_path / "trial.log"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(jsonl))
    tracking = Tracking(project_name="mart", experiment_name="t-a1", default_backend=["console", "file"])
    file_tail, console_tail = MetricsTail(jsonl), ConsoleMetricsTail(log)
    capfd.readouterr()
    try:
        for step, data in STEPS.items():
            tracking.log(data=data, step=step)
            # under Ray each worker line carries its actor's prefix (RAY_COLOR_PREFIX=0: no colour codes)
            printed = capfd.readouterr().out
            with open(log, "a") as f:
                f.writelines(f"(TaskRunnerV1 pid=4242) {line}\n" for line in printed.splitlines())
            # the tails see each step as soon as verl wrote it, once
            [from_file] = file_tail.read_new()
            [from_console] = console_tail.read_new()
            assert from_file.step == from_console.step == step
            assert same(from_file.data, expected(data, "file")), (step, from_file.data, printed)
            assert same(from_console.data, expected(data, "console")), (step, from_console.data, printed)
    finally:
        tracking.finish()
    assert file_tail.read_new(final=True) == [] and console_tail.read_new(final=True) == []
    # the runner's reader: the file once it exists, each step once; the routes agree on every key both carry
    both = FallbackMetricsTail(jsonl, log).read_new(final=True)
    assert [r.step for r in both] == list(STEPS)
    console = ConsoleMetricsTail(log).read_new(final=True)
    for f, c in zip(both, console):
        shared = f.data.keys() & c.data.keys()
        assert same({k: f.data[k] for k in shared}, {k: c.data[k] for k in shared}), (f.step, f.data, c.data)
        assert c.data.keys() <= f.data.keys()


def test_console_step_after_a_progress_bar_fragment_is_read(tmp_path, capfd):
    """verl's fit() draws a tqdm bar on stderr with no newline; where stdout and stderr share a log, the next
    step line is glued to the bar's last fragment (seen with verl's own loop in tests/support/verl_cpu_trainer.py)."""
    from verl.utils.tracking import Tracking

    tracking = Tracking(project_name="mart", experiment_name="t", default_backend=["console"])
    capfd.readouterr()
    tracking.log(data={"actor/entropy": 0.75, "training/global_step": 7}, step=7)
    line = capfd.readouterr().out.strip()
    log = tmp_path / "trial.log"
    log.write_text(f"\rTraining Progress:  50%|#####     | 7/14 [00:03<00:03,  2.0it/s]{line}\n")
    [rec] = ConsoleMetricsTail(log).read_new()
    assert rec.step == 7 and rec.data == {"actor/entropy": 0.75, "training/global_step": 7.0}
