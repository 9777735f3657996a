"""`mart tune` and `mart resume`: the commands that drive a session, and what they say when interrupted."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Optional

import typer

from mart.graph.cli.errors import fail, hint_ref, io_fail, one_line_errors
from mart.graph.cli.flags import (
    BACKEND_AGAIN,
    ENTRYPOINT_AGAIN,
    JSON,
    LLM_URL_AGAIN,
    RAY_ADDRESS_AGAIN,
    RUNS_DIR,
    TRUST_RUN,
    BackendFlags,
    allowed,
    api_key,
    backend_flags,
)
from mart.graph.cli.output import finish
from mart.graph.cli_options import flag_names, model_options
from mart.state.options import TuneOptions

TUNE_FLAG_ALIASES = {
    "memory_margin": ["--margin"],
    "num_candidates": ["--candidates"],
    "wall_clock_s": ["--wall-clock"],
    "llm_timeout_s": ["--llm-timeout"],
    "llm_price_per_mtok": ["--llm-price"],
    "quiet": ["-q"],
}


@one_line_errors
@model_options(TuneOptions, exclude=["backend_options", "start_overrides"], aliases=TUNE_FLAG_ALIASES, into="fields")
@backend_flags
def tune(
    # command-line-only flags; every TuneOptions and BackendFlags field is added as a flag by its decorator
    detach: bool = typer.Option(False, "--detach", help="Exit at the first review (same as --approve none)."),
    slack_channel: Optional[str] = typer.Option(
        None, help="With --approve slack: channel id to post reviews to (default $MART_SLACK_CHANNEL)."),
    slack_api_url: Optional[str] = typer.Option(
        None, help="Slack Web API base URL (default $MART_SLACK_API_URL, else Slack's); the token is $SLACK_BOT_TOKEN."),
    llm_api_key: Optional[str] = typer.Option(None, hidden=True, help="Refused: a key on the command line is "
                                                                      "visible to every user in the process list."),
    llm_api_key_file: Optional[Path] = typer.Option(
        None, help="File holding the API key (default $OPENAI_API_KEY); never stored, never on the command line."),
    set_: list[str] = typer.Option(
        [], "--set", help="KEY=VALUE change to the base config every stage starts from (verl key names); repeatable."),
    as_json: bool = JSON,
    fields: Optional[dict] = None,  # the TuneOptions fields, filled in by @model_options
    backend_flags: Optional[dict] = None,  # the BackendFlags fields, filled in by @backend_flags
) -> None:
    """Run a tuning session: system knobs for throughput, then learning knobs for score (the default stages),
    then, with --stages ...,schedule, a schedule of learning knobs per training segment."""
    from pydantic import ValidationError

    from mart.graph.session import tune as run_tune
    from mart.state.run_store import RunError

    if llm_api_key is not None:
        fail("--llm-api-key: a key on the command line is visible in the process list; set $OPENAI_API_KEY or "
              "pass --llm-api-key-file PATH")
    key = api_key(llm_api_key_file)
    if detach:
        fields["approve"] = "none"
    from mart.state.config_values import parse_assignments

    try:
        start_overrides = parse_assignments(set_)
    except ValueError as e:
        fail(f"--set: {e}")
    try:
        options = TuneOptions(backend_options=BackendFlags(**backend_flags).backend_options(),
                              start_overrides=start_overrides, **fields)
    except ValidationError as e:
        flags = flag_names(TuneOptions, TUNE_FLAG_ALIASES)
        fail("; ".join(f"{flags.get(str(err['loc'][0]), err['loc'][0]) if err['loc'] else 'options'}: {err['msg']}"
                        for err in e.errors()))
    reviewer = None
    if options.approve == "slack":
        from mart.graph.reviewers.slack import SlackConfigError, SlackReviewer

        reviewer = SlackReviewer(channel=slack_channel, api_url=slack_api_url)
        try:
            reviewer.check()
        except SlackConfigError as e:
            fail(str(e))
    from mart.graph.stop import Interrupts

    with Interrupts().installed() as interrupts:  # until the end of the interrupted path: a second Ctrl-C counts
        try:
            summary = run_tune(options, api_key=key, reviewer=reviewer)
        except (RunError, ValueError) as e:
            fail(str(e))
        except KeyboardInterrupt as e:
            interrupted(getattr(e, "run_id", None), options.runs_dir, interrupts)
        except (OSError, sqlite3.Error) as e:
            io_fail(e, hint_ref("RUN", options.runs_dir))
    finish(summary, as_json, options.runs_dir)
    if reviewer is not None and reviewer.failed:
        fail(f"{reviewer.failed}; the run is paused", 1)


@one_line_errors
def resume(
    run: str = typer.Argument(..., help="Run id (in --runs-dir) or a run directory's path."),
    runs_dir: Path = RUNS_DIR,
    approve: Optional[str] = typer.Option(None, help="Reviewer channel from now on (default: the run's)."),
    detach: bool = typer.Option(False, "--detach", help="Exit at the next review."),
    llm_api_key_file: Optional[Path] = typer.Option(
        None, help="File holding the API key for LLM agents (default $OPENAI_API_KEY); never on the command line."),
    backend: list[str] = BACKEND_AGAIN,
    verl_entrypoint: Optional[str] = ENTRYPOINT_AGAIN,
    llm_base_url: Optional[str] = LLM_URL_AGAIN,
    ray_address: Optional[str] = RAY_ADDRESS_AGAIN,
    trust_run: bool = TRUST_RUN,
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    as_json: bool = JSON,
) -> None:
    """Continue a run after a crash, a reboot or a pause; re-attaches a trial that is still running."""
    import sys

    from mart.graph.session import resume as run_resume
    from mart.state.run_store import RunError

    if approve is None and not detach and not as_json and sys.stdin.isatty() and stored_approve(run, runs_dir) == "none":
        approve = "tty"  # a detached run resumed at a terminal: its pending review is asked here
    from mart.graph.stop import Interrupts

    with Interrupts().installed() as interrupts:  # until the end of the interrupted path: a second Ctrl-C counts
        try:
            summary = run_resume(run, runs_dir, api_key=api_key(llm_api_key_file),
                                 approve="none" if detach else approve, quiet=quiet or None,
                                 allowed=allowed(backend, verl_entrypoint, llm_base_url, ray_address), trust=trust_run)
        except (RunError, ValueError) as e:
            fail(str(e))
        except KeyboardInterrupt:
            interrupted(run, runs_dir, interrupts)
        except (OSError, sqlite3.Error) as e:
            io_fail(e, hint_ref(run, runs_dir))
    finish(summary, as_json, runs_dir)


def interrupted(run: str | None, runs_dir: str | Path, interrupts) -> None:
    """A signal stopped a command driving ``run``: say what runs on (``mart.graph.stop.after_interrupt``), exit."""
    interrupts.stopping = True  # from now on a second Ctrl-C is counted (it stops the trials), not raised
    from mart.graph.stop import after_interrupt

    if run is None:
        fail("interrupted before the run was created; nothing was saved", 128 + (interrupts.first or 2))
    with interrupts.installed():  # (again, where the command's block has ended): a second Ctrl-C is counted
        code = after_interrupt(run, runs_dir, interrupts, lambda line: typer.echo(line, err=True))
    raise typer.Exit(code)


def stored_approve(run: str, runs_dir: Path) -> str | None:
    """The reviewer channel a run was started with (None when it cannot be read: resume reports why)."""
    from mart.state.run_store import RunError, RunStore

    try:
        store = RunStore.open(run, runs_dir, readonly=True)
    except RunError:
        return None
    try:
        return ((store.ledger.run(store.run_id) or {}).get("options") or {}).get("approve")
    except ValueError:
        return None
    finally:
        store.close()
