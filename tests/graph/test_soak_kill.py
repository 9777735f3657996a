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
