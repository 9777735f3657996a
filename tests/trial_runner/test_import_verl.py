"""``mart import-verl`` on verl's own example scripts, and on hostile or careless input (issues 26 and 27).

The oracle of what verl gets from a script is bash itself: each script runs under ``bash`` with ``python3``
stubbed to record its arguments, in a clean environment, and mart's overrides must equal those arguments read
with verl's value grammar (issue 27: verl 0.9's scripts build the command from bash arrays, and mart imported
0 overrides from 40 of its 41 GRPO examples). mart never expands a variable of its own environment into a
value (issue 26 item 2): a secret in ``$OPENAI_API_KEY`` must not land in the base config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mart.state.config_values import parse_value
from mart.state.search_space import ConfigError
from mart.trial_runner.verl.script import import_run_script, import_run_script_file
from tests.support.paths import REPO

EXAMPLES = REPO / "tests" / "data" / "verl_examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("run_*.sh"))
HOME = "/home/oracle-user"


def cli(*args: str, env: dict[str, str] | None = None):
    return subprocess.run([sys.executable, "-m", "mart.graph.cli", "import-verl", *args], cwd=REPO,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120)


def bash_oracle(script: Path, tmp_path: Path) -> list[str]:
    """The arguments bash gives ``python3 -m verl.trainer.main_ppo`` when it runs ``script`` (nothing else runs:
    python3/python are stubs; ``-c`` probes fail, as on a box without torch_npu)."""
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    out = tmp_path / "argv.json"
    stub = (f"#!{sys.executable}\nimport json, sys\n"
            f"if sys.argv[1:3] == ['-m', 'verl.trainer.main_ppo']:\n"
            f"    json.dump(sys.argv[3:], open({str(out)!r}, 'w'))\n"
            "elif sys.argv[1:2] == ['-c']:\n    sys.exit(1)\n")
    for name in ("python3", "python"):
        (stubs / name).write_text(stub)
        (stubs / name).chmod(0o755)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    env = {"HOME": HOME, "PATH": f"{stubs}:/usr/bin:/bin"}
    proc = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", SCRIPTS)
def test_verl_examples_import_what_bash_would_pass(name, tmp_path):
    args = bash_oracle(EXAMPLES / name, tmp_path)
    expected, options = {}, []
    for arg in args:
        if arg.startswith("-"):  # Hydra's own options (--config-name=...): no override, reported by mart
            options.append(arg)
            continue
        key, _, value = arg.lstrip("+").partition("=")
        expected[key] = parse_value(value)
    imported = import_run_script_file(EXAMPLES / name, env={"HOME": HOME})
    assert all(any(o in u for u in imported.unresolved) for o in options)
    assert imported.passes_args and len(expected) >= 30
    # mart keeps $HOME as a reference verl resolves in the trial's environment (never its value)
    got = {k: json.loads(json.dumps(v).replace("${oc.env:HOME}", HOME)) for k, v in imported.overrides.items()}
    assert got == expected, {k: (got.get(k), expected.get(k)) for k in set(got) | set(expected)
                             if got.get(k) != expected.get(k)}
    assert all(HOME not in json.dumps(v) for v in imported.overrides.values())


def test_the_cli_on_a_verl_example_and_on_a_script_without_overrides(tmp_path):
    out = tmp_path / "base.yaml"
    proc = cli(str(EXAMPLES / "run_qwen3_4b_fsdp.sh"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "overrides" in proc.stderr and "case" in proc.stderr  # the npu branch's changes are named, not taken
    from mart.trial_runner.verl.overrides import load_base_config

    base = load_base_config(out)
    assert base["trainer.n_gpus_per_node"] == 8 and base["actor_rollout_ref.rollout.n"] == 5
    empty = tmp_path / "empty.sh"
    empty.write_text("#!/bin/bash\nARGS=()\npython3 -m verl.trainer.main_ppo \"${ARGS[@]}\" \"$@\"\n")
    proc = cli(str(empty), "-o", str(tmp_path / "e.yaml"))
    assert proc.returncode != 0 and "0 overrides" in proc.stderr and not (tmp_path / "e.yaml").exists()


def test_launch_arrays_and_one_line_arrays():
    text = ("LAUNCH=(python3 -m verl.trainer.main_ppo)\nOPTS=(a.b=1 'c.d=two words')\nOPTS+=(e.f=[1,2])\n"
            "\"${LAUNCH[@]}\" \"${OPTS[@]}\" g.h=${OPTS[0]#a.b=} \"$@\"\n")
    imported = import_run_script(text, env={})
    assert imported.launcher[-1] == "verl.trainer.main_ppo"
    assert imported.overrides["a.b"] == 1 and imported.overrides["c.d"] == "two words"
    assert imported.overrides["e.f"] == [1, 2]


SECRETS = {"OPENAI_API_KEY": "sk-live-0123456789abcdefghij", "SLACK_BOT_TOKEN": "xoxb-111-222-secret",
           "MY_DATA": "/secret/mount/data"}


def test_import_never_expands_the_environment_into_a_value(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\nKEY=$OPENAI_API_KEY\n"
                      "python3 -m verl.trainer.main_ppo +a.key=$KEY +b.tok=\"${SLACK_BOT_TOKEN}\" "
                      "data.train_files=${MY_DATA}/train.parquet data.val_files=${MY_DATA:-/d}/test.parquet "
                      "data.train_batch_size=${BATCH:-256} \"$@\"\n")
    out = tmp_path / "base.yaml"
    proc = cli(str(script), "-o", str(out), env=SECRETS)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text() + proc.stderr + proc.stdout
    for secret in SECRETS.values():
        assert secret not in text
    from mart.trial_runner.verl.overrides import load_base_config

    base = load_base_config(out)
    assert base["a.key"] == "${oc.env:OPENAI_API_KEY}" and base["b.tok"] == "${oc.env:SLACK_BOT_TOKEN}"
    assert base["data.train_files"] == "${oc.env:MY_DATA}/train.parquet"
    assert base["data.val_files"] == "/d/test.parquet"  # the script's default; the environment is not read
    assert base["data.train_batch_size"] == 256
    assert "MY_DATA" in proc.stderr  # said so


def test_binary_huge_and_special_files_fail_in_one_line(tmp_path):
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x7fELF\x02\x01\x00\x00" + bytes(range(256)) * 8)
    huge = tmp_path / "huge.sh"
    huge.write_text("python3 -m verl.trainer.main_ppo \\\n" + "".join(f"  +k.x{i}=1 \\\n" for i in range(120_000))
                    + "  \"$@\"\n")
    for path, words in ((binary, "not a text file"), (huge, "over"), (Path("/dev/zero"), "regular file"),
                        (tmp_path, "regular file")):
        proc = cli(str(path))
        assert proc.returncode == 2, (path, proc.stderr)
        assert proc.stderr.startswith("error:") and proc.stderr.count("\n") == 1, proc.stderr
        assert words in proc.stderr and "Traceback" not in proc.stderr
    many = "python3 -m verl.trainer.main_ppo " + " ".join(f"+k.x{i}=1" for i in range(20_000)) + "\n"
    with pytest.raises(ConfigError, match="overrides"):
        import_run_script(many, env={})
