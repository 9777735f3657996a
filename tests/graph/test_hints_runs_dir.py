"""After `--runs-dir X`, every command a hint prints names the run with `--runs-dir X`: a hint without it addresses
another run of the same id in ./runs (issue 47)."""

from __future__ import annotations

import re

from mart.state.run_store import run_ref
from tests.support.cli import TOY, cli

_HINT = re.compile(r"`(mart [^`]*)`")


def _hints(text: str) -> list[str]:
    return [h for h in _HINT.findall(text) if re.search(r"mart (review|resume|status|watch|stop|trials|report|export) \S",
                                                         h)]


def test_every_hint_after_runs_dir_repeats_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()  # a ./runs beside it: a hint without --runs-dir would address this one
    runs = "colleague"
    said: list[str] = []
    tune = cli("tune", "--backend", TOY, "--approve", "none", "--runs-dir", runs, "--system-trials", "3",
               "--learning-trials", "0", "--system-horizon", "3", "--watch-interval-s", "0.01", "--no-report")
    assert tune.exit_code == 0, tune.output
    said.append(tune.output)
    run = next(p.name for p in (tmp_path / runs).iterdir() if not p.name.startswith("."))
    approved = cli("review", run, "--runs-dir", runs, "--approve", "--detach")  # the case
    assert approved.exit_code == 0, approved.output
    said.append(approved.output)
    for args in (("status", run), ("status",), ("status", "--pending")):
        out = cli(*args, "--runs-dir", runs)
        assert out.exit_code == 0, out.output
        said.append(out.output)
    listing = said[-1]
    assert f"mart review {run} --runs-dir {runs}" in listing  # the listing's "answer with" column, whole
    hints = [h for text in said for h in _hints(text)]
    assert len(hints) >= 4, said
    assert [h for h in hints if f"--runs-dir {runs}" not in h or "\n" in h] == []  # whole, on one line

    # a run with no pending review: the refusal's hint too
    while "paused" in cli("status", run, "--runs-dir", runs).output:
        assert cli("review", run, "--runs-dir", runs, "--approve", "--detach", "-q").exit_code == 0
    done = cli("review", run, "--runs-dir", runs, "--approve")
    assert done.exit_code == 2 and f"`mart status {run} --runs-dir {runs}`" in done.output


def test_run_ref_leaves_out_the_default_and_quotes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_ref(tmp_path / "runs" / "r1", "runs") == "r1"
    assert run_ref(tmp_path / "my runs" / "r1", "my runs") == "r1 --runs-dir 'my runs'"
    # a run addressed by its path: the folder that holds it
    assert run_ref(tmp_path / "x" / "r1", "runs") == f"r1 --runs-dir {tmp_path / 'x'}"
