"""scripts/gpu_check.sh, the check for a lent GPU: its dry run works on any machine, its verdict follows the
documented rules (docs/backends.md, "GPU check"), and its whole flow runs on the CPU (``--smoke-cpu``; no GPU
figures). What it measures on a GPU can only be seen there."""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest

from tests.support.paths import REPO

SCRIPT = REPO / "scripts" / "gpu_check.sh"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_prints_the_plan_as_one_json_object_and_exits_0(tmp_path):
    out = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(tmp_path)], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    verdict = json.loads(out.stdout)  # the whole of stdout is the one JSON object
    assert verdict["verdict"] == "dry-run"
    plan = verdict["plan"]
    assert "24 layers x 1024 wide" in plan["model"] and "CUDA" in plan["model"]
    assert [t.split(":")[0] for t in plan["trials"]] == ["base", "micro16", "at-margin", "over-margin"]
    assert {"over_margin_refused", "at_margin_within_limit"} <= {c.split()[0] for c in plan["checks"]}
    assert "torch" in verdict["environment"] and list(tmp_path.iterdir()) == []  # it ran nothing


def _run(status="completed", peak=1.0, growth=1.4, over=None):
    return {"status": status, "trial_peak_gb": peak, "device_growth_gb": growth, "reason": None,
            "overrides": over or {}}


def test_the_verdict_follows_the_margin_rule():
    gc = _module()
    env = {"cuda": True, "memory_source": "nvml", "visible": {"match": True}}
    trials = {"base": _run(peak=1.0), "micro16": _run(peak=1.2), "at-margin": _run(peak=1.3),
              "over-margin": _run("oom", peak=None)}
    critic = {"at-margin": {"accepted": True, "reasons": ["passes constraints"]},
              "over-margin": {"accepted": False, "reasons": ["predicted peak memory 2.00 GB exceeds the limit 1.40 GB"]}}
    ok = gc.judge(env, trials, critic, limit_gb=1.4)
    assert ok["verdict"] == "pass" and all(ok["checks"].values())
    assert any("refusal was right" in n for n in ok["notes"])
    # each rule, broken once, fails the verdict and names its check
    broken = {
        "at_margin_within_limit": (trials | {"at-margin": _run(peak=1.41)}, critic, env),
        "at_margin_completed": (trials | {"at-margin": _run("failed", peak=1.2)}, critic, env),
        "over_margin_refused": (trials, critic | {"over-margin": {"accepted": True, "reasons": ["passes"]}}, env),
        "at_margin_accepted": (trials, critic | {"at-margin": {"accepted": False, "reasons": ["risk"]}}, env),
        "calibration_completed": (trials | {"micro16": _run("failed")}, critic, env),
        "nvml_visible_matches_torch": (trials, critic, env | {"visible": {"match": False}}),
        "cuda_device": (trials, critic, env | {"cuda": False}),
    }
    for check, (t, c, e) in broken.items():
        got = gc.judge(e, t, c, limit_gb=1.4)
        assert got["verdict"] == "fail" and not got["checks"][check], check
        assert sum(not v for v in got["checks"].values()) == 1, (check, got["checks"])
    # the emulated capacity puts the limit 3% above the at-margin prediction, under the margin's rule
    capacity, limit = gc.margin_setup(10.0, 0.1)
    assert limit == pytest.approx(10.3) and (1 - 0.1) * capacity == pytest.approx(limit)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_whole_check_runs_on_the_cpu(tmp_path, local_cache):
    out = subprocess.run(["bash", str(SCRIPT), "--smoke-cpu", "--steps", "2", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=540, cwd=tmp_path)
    result = json.loads(out.stdout)
    assert "GPU" in result["environment"]["smoke_cpu"] and "CPU" in result["plan"]["model"]
    assert set(result["trials"]) == {"base", "micro16", "at-margin", "over-margin"}
    assert result["checks"]["calibration_completed"], result["trials"]
    critic = result["margin"]["critic"]
    limit = result["margin"]["limit_gb"]
    # by construction: over-margin is predicted > 1.1 x the limit, at-margin 3% under it; the critic agrees
    assert critic["over-margin"]["predicted_gb"] > 1.1 * limit and result["checks"]["over_margin_refused"]
    assert critic["at-margin"]["predicted_gb"] < limit and result["checks"]["at_margin_accepted"]
    assert out.returncode == (0 if result["verdict"] == "pass" else 1)
