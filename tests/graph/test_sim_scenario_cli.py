"""A user's scenario file runs through `mart tune --backend sim --approve auto` (issue 12)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.paths import REPO

EXAMPLE = REPO / "examples" / "scenarios" / "llama-3.1-8b-2x8-a100.yaml"


@pytest.mark.slow
def test_tune_runs_a_user_scenario_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from mart.graph.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [
        "tune", "--backend", "sim", "--backend-option", f"scenario_file={EXAMPLE}", "--backend-option", "perturb=3",
        "--approve", "auto", "--system-trials", "3", "--learning-trials", "2"])
    assert result.exit_code == 0, result.output
    assert "completed" in result.output and "system (tok/s/GPU)" in result.output


def test_a_bad_scenario_file_is_refused_with_the_field(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mart.graph.cli import app

    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("gpu: A100-80GB", "gpu: A100-20GB"))
    result = CliRunner().invoke(app, ["tune", "--backend", "sim", "--backend-option", f"scenario_file={bad}",
                                      "--approve", "auto", "--system-trials", "2", "--learning-trials", "0"],
                                env={**os.environ})
    assert result.exit_code != 0
    assert "cluster.gpu" in result.output + str(result.exception)
