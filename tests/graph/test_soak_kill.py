"""The kill -9 soak (scripts/soak_kill.py) with a few kills: no trial lost or run twice, every run completes."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.slow


def test_soak_with_a_few_kills(capsys, local_cache):
    spec = importlib.util.spec_from_file_location("soak_kill", REPO / "scripts" / "soak_kill.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    code = soak.main(["--kills", "3", "--seed", "3", "--max-wait", "8", "--system-trials", "2",
                      "--learning-trials", "2", "--learning-horizon", "4"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, json.dumps(report)
    assert report["kills"] == 3 and report["problems"] == [] and report["lost_or_duplicated_trials"] == 0
    assert report["runs"] >= 1 and report["trials"] == report["runs"] * 4


def test_soak_with_two_trials_at_once_and_kills_in_the_launch_window(capsys, local_cache):
    spec = importlib.util.spec_from_file_location("soak_kill", REPO / "scripts" / "soak_kill.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    code = soak.main(["--kills", "4", "--seed", "5", "--max-wait", "6", "--system-trials", "3",
                      "--learning-trials", "2", "--learning-horizon", "4", "--parallel", "2",
                      "--launch-window-share", "0.5"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, json.dumps(report)
    assert report["kills"] == 4 and report["kills_in_the_launch_window"] >= 1 and report["problems"] == []
    # never two processes of one trial: the sampler's count (0 when, under load, none of its samples fell while a
    # trainer ran: it proves nothing then), beside the logs' count of trainer starts per trial, which `problems`
    # holds ("the trainer started N times") and which needs no luck
    assert report["most_trainers_per_trial"] <= 1
    assert report["trials"] == report["runs"] * 5
