"""Issue 26 item 7: input files are capped in size and must be regular files; simulated jobs have bounds.

A 100 MB scenario file, or one that names ``/dev/zero``, was read whole (7.7 GB RSS, then MemoryError);
``val_size: 1e11`` made a simulated trial that never ends.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from mart.state.search_space import ConfigError
from mart.trial_runner.sim.scenarios import SHIPPED_DIR, ScenarioError, load_scenario

pytestmark = pytest.mark.timeout(60)


def shipped_text() -> str:
    from importlib import resources

    return (resources.files("mart.trial_runner.sim") / SHIPPED_DIR / "qwen3-0.6b-1x8.yaml").read_text()


def test_scenario_files_must_be_small_regular_files(tmp_path):
    link = tmp_path / "zero.yaml"
    link.symlink_to("/dev/zero")
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    big = tmp_path / "big.yaml"
    with open(big, "w") as f:
        f.write(shipped_text())
        f.write("# " + "x" * (8 << 20) + "\n")
    for path, words in ((link, "regular file"), (fifo, "regular file"), (big, "over the limit")):
        start = time.monotonic()
        with pytest.raises((ScenarioError, ValueError), match=words):
            load_scenario(str(path))
        assert time.monotonic() - start < 5  # refused, not read (a FIFO would block for ever)


@pytest.mark.parametrize("field, value", [("val_size", 1e11), ("train_batch_size", 10**12),
                                          ("max_response_length", 10**10), ("rollout_n", 10**6),
                                          ("test_freq", 10**12)])
def test_simulated_workloads_have_bounds(tmp_path, field, value):
    data = yaml.safe_load(shipped_text())
    data["workload"][field] = value
    path = tmp_path / "sc.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises((ScenarioError, ValueError), match=field):
        load_scenario(str(path))


def test_base_config_files_are_capped_and_regular(tmp_path):
    from mart.state.config_values import load_config_file

    link = tmp_path / "zero.yaml"
    link.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="regular file"):
        load_config_file(link)
    big = tmp_path / "big.yaml"
    big.write_text("a: 1\n# " + "x" * (8 << 20) + "\n")
    with pytest.raises(ConfigError, match="over the limit"):
        load_config_file(big)
    ok = tmp_path / "ok.yaml"
    ok.write_text("a.b: 1\n")
    assert load_config_file(ok) == {"a.b": 1}
    assert Path(ok).exists()
