"""`mart tune`'s flags come from TuneOptions' fields; unknown option keys are refused with the valid list."""

from __future__ import annotations

from typing import Literal

import pytest
import typer
from pydantic import BaseModel, Field, ValidationError
from typer.testing import CliRunner

from mart.graph.cli import app
from mart.graph.cli.flags import BackendFlags
from mart.graph.cli.tune import TUNE_FLAG_ALIASES
from mart.graph.cli_options import model_options
from mart.state.options import TuneOptions

GENERATED = [name for name in TuneOptions.model_fields if name not in ("backend_options", "start_overrides")]


def run(*args: str, app_=app):
    return CliRunner().invoke(app_, list(args), env={"COLUMNS": "400", "TERM": "dumb", "NO_COLOR": "1"})


def tune_params() -> dict:
    command = typer.main.get_command(app).commands["tune"]
    return {p.name: p for p in command.params}


@pytest.fixture
def captured(monkeypatch):
    """Run `mart tune` up to the session: the TuneOptions it would start with."""
    import mart.graph.session as session

    seen: dict = {}

    def fake_tune(options, api_key=None, reviewer=None):
        seen["options"] = options
        return {"run_id": "x", "status": "paused", "pending_review": None}

    monkeypatch.setattr(session, "tune", fake_tune)
    return seen


def test_every_field_is_a_flag_with_the_models_default_and_description():
    params = tune_params()
    for name in GENERATED:
        field = TuneOptions.model_fields[name]
        assert name in params, f"TuneOptions.{name} has no flag"
        p = params[name]
        assert f"--{name.replace('_', '-')}" in p.opts + p.secondary_opts
        assert field.description and p.help.startswith(field.description), (name, p.help)
        default = p.default.value if hasattr(p.default, "value") else p.default
        want = field.get_default(call_default_factory=True)
        want = ",".join(want) if isinstance(want, list) else want  # a list flag's default is its text form
        assert default == want, (name, default, want)
    for name, flags in TUNE_FLAG_ALIASES.items():
        assert set(flags) <= set(params[name].opts), name


def test_trial_and_tune_take_the_same_backend_flags_from_one_model():
    commands = typer.main.get_command(app).commands
    for command in ("trial", "tune"):
        params = {p.name: p for p in commands[command].params}
        for name, field in BackendFlags.model_fields.items():
            assert params[name].opts == [f"--{name.replace('_', '-')}"], (command, name)
            assert params[name].help == field.description, (command, name)
    assert commands["tune"].params[-1].multiple  # --backend-option is given once per value, never split at commas


def test_help_shows_every_option_with_help_and_default():
    out = run("tune", "--help")
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    for name in GENERATED:
        assert f"--{name.replace('_', '-')}" in text, name
        assert TuneOptions.model_fields[name].description.split("(")[0].strip() in text, name
    assert "[default: tty]" in text and "tty|auto|none|slack" in text
    assert "(>= 1, <= 10)" in text  # num_candidates' bounds, from the model
    for flag in ("--detach", "--backend-option", "--json", "--base-config"):  # command-line-only flags stay
        assert flag in text


def test_approve_defaults_to_the_terminal_in_the_model_and_the_cli(captured):
    assert TuneOptions().approve == "tty"
    assert run("tune").exit_code == 0
    assert captured["options"].approve == "tty"


def test_readme_flags_still_work_and_reach_the_options(captured, tmp_path):
    out = run("tune", "--backend", "sim", "--approve", "auto", "--margin", "0.2", "--candidates", "2",
              "--wall-clock", "30", "--llm-timeout", "5", "--llm-price", "0.5,1.5", "-q", "--system-trials", "3",
              "--learning-trials", "0", "--runs-dir", str(tmp_path), "--max-revision-rounds", "1",
              "--scenario", "qwen3-0.6b-1x8", "--backend-option", "seed=3")
    assert out.exit_code == 0, out.output
    o = captured["options"]
    assert (o.backend, o.approve, o.memory_margin, o.num_candidates, o.wall_clock_s, o.llm_timeout_s) == \
        ("sim", "auto", 0.2, 2, 30.0, 5.0)
    assert o.llm_price_per_mtok == (0.5, 1.5) and o.quiet and o.system_trials == 3 and o.learning_trials == 0
    assert o.runs_dir == str(tmp_path) and o.max_revision_rounds == 1
    assert o.backend_options == {"scenario": "qwen3-0.6b-1x8", "seed": 3}
    run("tune", "--approve", "slack", "--detach")
    assert captured["options"].approve == "none"  # --detach wins


@pytest.mark.parametrize("args, words", [
    (["--margin", "1.5"], "--margin, --memory-margin: Input should be less than 1"),
    (["--system-trials", "0"], "--system-trials: Input should be greater than or equal to 1"),
    (["--llm-price", "1"], "--llm-price, --llm-price-per-mtok"),
    (["--approve", "maybe"], "'maybe' is not one of"),
    (["--system-trial", "3"], "No such option: --system-trial"),
])
def test_bad_flags_are_refused_naming_the_flag(captured, args, words):
    out = run("tune", *args)
    assert out.exit_code == 2 and "options" not in captured
    assert words in " ".join(out.output.split()), out.output


def test_unknown_option_keys_are_refused_with_the_valid_list():
    """The Python API and Studio's input `options` go through the same model."""
    with pytest.raises(ValidationError, match=r"unknown option\(s\) system_trial; valid options: .*system_trials"):
        TuneOptions(system_trial=3)
    with pytest.raises(ValidationError, match="unknown option"):
        TuneOptions.model_validate({"backend": "sim", "approve": "auto", "candidates": 2})


def test_studio_input_with_an_unknown_option_creates_no_run(tmp_path):
    from mart.graph.studio import graph

    runs = tmp_path / "runs"
    with pytest.raises(ValidationError, match=r"unknown option\(s\) system_trial"):
        graph.invoke({"options": {"system_trial": 3, "runs_dir": str(runs)}},
                     config={"configurable": {"thread_id": "t1"}})
    assert not runs.exists()


def test_unknown_backend_option_is_refused_before_a_run_folder(tmp_path):
    runs = tmp_path / "runs"
    out = run("tune", "--backend", "sim", "--approve", "auto", "--runs-dir", str(runs), "--backend-option", "bogus=1")
    assert out.exit_code == 2
    text = " ".join(out.output.split())
    assert "backend 'sim' takes no option 'bogus'; valid options: scenario, seed" in text
    assert not runs.exists()
    out = run("tune", "--backend", "local", "--approve", "auto", "--runs-dir", str(runs), "--scenario", "x")
    assert out.exit_code == 2 and "takes no option 'scenario'" in out.output and not runs.exists()


def test_unknown_backend_option_is_refused_before_a_trial_folder(tmp_path):
    out = run("trial", "--backend", "sim", "--out", str(tmp_path / "t"), "--backend-option", "bogus=1")
    assert out.exit_code == 2 and "valid options" in out.output
    assert not (tmp_path / "t").exists()
    out = run("trial", "--backend", "sim", "--out", str(tmp_path / "t"), "--backend-option", "seed=a,b")
    assert out.exit_code == 2 and "Hydra sweep" in out.output


class Demo(BaseModel):
    name: str = Field("x", description="A name.")
    level: Literal["low", "high"] = Field("low", description="A level.")
    count: int = Field(2, ge=0, description="How many.")
    ratio: float | None = Field(None, gt=0, description="A ratio.")
    pair: tuple[int, int] | None = Field(None, description="Two ints.")
    verbose: bool = Field(False, description="Talk more.")
    color: bool = Field(True, description="Colour output.")


def test_the_adapter_works_for_any_model():
    demo = typer.Typer()
    got: dict = {}

    @demo.command()
    @model_options(Demo, aliases={"count": ["-n"]}, into="values")
    def main(extra: str = typer.Option("e", help="Own flag."), values: dict = None) -> None:
        got.update(Demo(**values).model_dump(), extra=extra)

    assert run(app_=demo).exit_code == 0
    assert got == {"name": "x", "level": "low", "count": 2, "ratio": None, "pair": None, "verbose": False,
                   "color": True, "extra": "e"}
    out = run("--level", "high", "-n", "5", "--ratio", "0.5", "--pair", "3,4", "--verbose", "--no-color",
              "--extra", "z", app_=demo)
    assert out.exit_code == 0, out.output
    assert got == {"name": "x", "level": "high", "count": 5, "ratio": 0.5, "pair": (3, 4), "verbose": True,
                   "color": False, "extra": "z"}
    with pytest.raises(ValueError, match="generates"):
        model_options(Demo)(lambda name="x", options=None: None)  # a flag declared twice
    with pytest.raises(ValueError, match="lacks"):
        model_options(Demo, aliases={"nope": ["-x"]})
