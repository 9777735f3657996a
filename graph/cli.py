"""The ``mart`` command line (typer). Subcommands stay thin: they parse, then call library functions."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Optional

import typer

from mart.graph.cli_options import flag_names, model_options
from mart.state.options import WATCH_INTERVAL_S, TuneOptions


class _OneLineErrors(typer.core.TyperGroup):
    """A refused command line (a bad value, an unknown flag) ends in one ``error:`` line naming the flag and the
    command's ``--help``, exit 2, like every error mart reports itself; typer's default draws a multi-line box."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):  # type: ignore[override]
        import sys

        # typer >= 0.20 carries its own copy of click (typer._click); older ones use click itself
        click = getattr(typer.core, "_click", None) or typer.core.click
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as e:  # the help is shown; nothing to add
            sys.exit(e.exit_code)
        except click.ClickException as e:
            ctx = getattr(e, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            typer.echo(f"error: {' '.join(e.format_message().split())}{hint}", err=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    name="mart",
    help="Tune the hyperparameters of LLM RL post-training jobs (GRPO on verl) with agents and a human reviewer.",
    no_args_is_help=True,
    add_completion=False,
)


def _os_cause(e: BaseException) -> str:
    """``FILE: cause`` of an OSError (or any error) on one line."""
    detail = getattr(e, "strerror", None) or str(e) or type(e).__name__
    where = getattr(e, "filename", None)
    return " ".join((f"{where}: {detail}" if where else f"{type(e).__name__}: {detail}").split())


def _hint_ref(run: str | Path, runs_dir: str | Path) -> str:
    """How a hint names the run the user addressed as ``run`` in ``runs_dir`` (``RunStore.ref`` before it is open)."""
    from mart.state.run_store import run_ref

    return run_ref(Path(run) if Path(run).is_dir() else Path(runs_dir) / str(run), runs_dir)


def _io_fail(e: BaseException, ref: str = "RUN") -> None:
    """A file-system or database failure (disk full, read-only, run folder deleted) as one line.

    The error that ended the session is named, not a later one raised while recording it ("database is
    locked": another connection still held the failed write), and a full disk is named as such."""
    first = e
    while first.__context__ is not None and isinstance(first.__context__, (OSError, sqlite3.Error)):
        first = first.__context__  # the failure that came first
    detail = getattr(first, "strerror", None) or str(first) or type(first).__name__
    where = getattr(first, "filename", None)
    full = "full" in detail.lower() or "no space" in detail.lower()
    _fail(f"{type(first).__name__}: {detail}" + (f": {where}" if where else "")
          + (f"; the disk is full: free space, then `mart resume {ref}`" if full else
             f"; the run keeps its last checkpoint: fix the cause and `mart resume {ref}`"), 1)


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _one_line_errors(command):
    """A command whose stored state cannot be read (a damaged or foreign run folder: unparseable options,
    poisoned checkpoints, a damaged SQLite page) ends in one ``error:`` line naming the run and the cause, exit
    1, instead of a traceback; ``MART_DEBUG=1`` shows the traceback. Errors a command reports itself pass."""
    import functools

    @functools.wraps(command)
    def run_command(*args, **kwargs):
        import os

        import click

        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, click.exceptions.Exit, click.exceptions.Abort, click.ClickException,
                KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - see the docstring
            if os.environ.get("MART_DEBUG"):
                raise
            what = kwargs.get("run") or kwargs.get("script")
            ref = _hint_ref(kwargs["run"], kwargs.get("runs_dir") or "runs") if kwargs.get("run") else "RUN"
            _fail(f"{f'{what}: ' if what else ''}{_os_cause(e)[:400]} (stored state mart cannot read: a damaged "
                  f"or foreign file? `mart trials {ref}` / `mart export {ref}` read what they can; MART_DEBUG=1 shows "
                  "where)", 1)

    return run_command


def _backend_options(items: list[str]) -> dict:
    from mart.state.config_values import parse_assignments

    try:
        return parse_assignments(items)
    except ValueError as e:
        typer.echo(f"error: --backend-option: {e}", err=True)
        raise typer.Exit(2) from None


@app.command()
def trial(
    backend: str = typer.Option("local", help="Backend: local, verl, sim, or package.module:factory."),
    steps: int = typer.Option(10, min=1, help="Training steps (the trial's horizon)."),
    out: Path = typer.Option(..., help="Trial directory (metrics.jsonl, status.json, trial.log)."),
    set_: list[str] = typer.Option([], "--set", help="Override KEY=VALUE (verl key names); repeatable."),
    config: Optional[Path] = typer.Option(None, help="YAML or JSON file of KEY: VALUE overrides (flat verl keys)."),
    memory_capacity_gb: Optional[float] = typer.Option(
        None, help="Memory capacity in GB (emulated GPU memory on CPU): a peak above it ends the trial as oom."
    ),
    seed: int = typer.Option(0, help="Random seed."),
    verl_entrypoint: Optional[str] = typer.Option(None, help="Command that launches verl (default: python -m verl.trainer.main_ppo)."),
    verl_python: Optional[str] = typer.Option(None, help="Interpreter that runs verl (default: this one; 'python' on Ray nodes)."),
    base_config: Optional[Path] = typer.Option(None, help="The user's base config (verl, local): YAML/JSON of KEY: VALUE."),
    ray_address: Optional[str] = typer.Option(None, help="Run the trial as a Ray job on this cluster (http://HEAD:8265)."),
    scenario: Optional[str] = typer.Option(None, help="sim backend: the cluster scenario (e.g. qwen3-8b-1x8)."),
    backend_option: list[str] = typer.Option(
        [], "--backend-option", help="KEY=VALUE passed to the backend's factory (plugins); repeatable."
    ),
    stage: Optional[str] = typer.Option(
        None, help="Run it as a tuning stage would: system (throughput, no validation) or learning (validated at the end)."),
) -> None:
    """Run one trial in the foreground and show its progress."""
    from mart.trial_runner.trial_command import run_trial

    options = {
        "memory_capacity_gb": memory_capacity_gb,
        "entrypoint": verl_entrypoint,
        "verl_python": verl_python,
        "base_config": str(base_config) if base_config else None,
        "ray_address": ray_address,
        "scenario": scenario,
        **_backend_options(backend_option),
    }
    code = run_trial(
        backend=backend,
        steps=steps,
        out=out,
        sets=set_,
        config_file=config,
        seed=seed,
        backend_options={k: v for k, v in options.items() if v is not None},
        stage=stage,
    )
    raise typer.Exit(code)



@app.command("memory")
def memory(
    config: Path = typer.Argument(..., help="A verl config: YAML/JSON of KEY: VALUE (flat or nested)."),
    set_: list[str] = typer.Option([], "--set", help="Override KEY=VALUE (verl key names); repeatable."),
    gpu: str = typer.Option(..., help="The GPU (e.g. H100-80GB, A100-40GB, L40S, B200)."),
    nnodes: int = typer.Option(1, min=1, help="Nodes."),
    gpus_per_node: int = typer.Option(8, min=1, help="GPUs per node."),
    model_config: Optional[Path] = typer.Option(None, help="The model's config.json (or its folder)."),
    gpu_memory_gb: Optional[float] = typer.Option(None, help="Memory per GPU in GB (default: the GPU table)."),
    margin: float = typer.Option(0.1, min=0.0, max=0.9, help="Memory margin: fits = peak <= (1 - margin) x memory."),
    logits: str = typer.Option("fused", help="Log-prob path: fused (flash-attn's cross-entropy, verl's images) or "
                               "fp32 (verl's non-fused path)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Predicted peak memory of each phase of a verl config (will it OOM?), before any trial."""
    from mart.graph.memory_cmd import MemoryCommandError, render, run

    try:
        result = run(config, set_, gpu, nnodes, gpus_per_node, model_config_path=model_config,
                     gpu_memory=gpu_memory_gb, margin=margin, logits=logits)
    except MemoryCommandError as e:
        _fail(str(e))
    if as_json:
        _print_json(result)
    else:
        typer.echo(render(result))


@app.command("import-verl")
@_one_line_errors
def import_verl(
    script: Path = typer.Argument(..., help="A verl run script (bash) with `python3 -m verl.trainer.main_ppo key=value ...`."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the base config here (default: stdout)."),
) -> None:
    """Turn a verl run script into a base config (YAML) for --base-config; says what it could not resolve.

    Reads line continuations, quotes, bash arrays ("${DATA[@]}"), $VAR / ${VAR:-default} from the script's
    own assignments, "$@" and list values; it never runs the script, and never copies a value of your
    environment ($HOME stays ${oc.env:HOME}, resolved by verl).
    """
    from mart.state.search_space import ConfigError
    from mart.trial_runner.verl.script import import_run_script_file, to_yaml

    try:
        imported = import_run_script_file(script)
    except ConfigError as e:
        _fail(str(e))
    if not imported.overrides:  # nothing to tune from: say why instead of writing an empty config
        typer.echo(imported.report(), err=True)
        _fail(f"{script}: the verl command on line {imported.line} yields 0 overrides; nothing written", 1)
    header = f"# mart base config imported from {script.name} (mart import-verl)\n"
    header += "".join(f"# NOT RESOLVED (left out): {u}\n" for u in imported.unresolved)
    header += "".join(f"# NOTE: {n}\n" for n in imported.notes)
    if imported.python_hint():
        header += f"# {imported.python_hint()}\n"
    text = to_yaml(imported.overrides, header)
    typer.echo(imported.report(), err=True)
    if out is None:
        typer.echo(text, nl=False)
    else:
        if out.exists():
            _fail(f"{out} exists; choose a new --out")
        out.write_text(text)
        typer.echo(f"wrote {out}: use it with --base-config {out}", err=True)


# -- tuning sessions ------------------------------------------------------------------------------
RUNS_DIR = typer.Option("runs", "--runs-dir", help="Where run directories live.")
JSON = typer.Option(False, "--json", help="Machine-readable output.")


BACKEND_AGAIN = typer.Option(
    [], "--backend", help="Allow this plugin backend spec (package.module:factory) stored in the run: a run folder "
                          "is untrusted, so code it names runs only when given again; repeatable.")
ENTRYPOINT_AGAIN = typer.Option(None, "--verl-entrypoint", help="Allow this launch command stored in the run.")
LLM_URL_AGAIN = typer.Option(None, "--llm-base-url", help="Allow the LLM agents' endpoint stored in the run (it "
                                                          "gets your API key); also $OPENAI_BASE_URL.")
RAY_ADDRESS_AGAIN = typer.Option(None, "--ray-address", help="Allow the Ray cluster stored in the run (it gets "
                                                             "your RAY_AUTH_TOKEN); also $RAY_ADDRESS.")
TRUST_RUN = typer.Option(False, "--trust-run", help="Run whatever backend and commands the run folder names "
                                                    "(only for folders you wrote).")


def _allowed(backends: list[str], *named: str | None) -> set[str]:
    """What the user names again for a stored run: plugin specs, a launch command, endpoints."""
    return {*backends, *(x for x in named if x)}


def _api_key(path: Path | None) -> str | None:
    """The LLM API key from a file (first line); None: the agents read $OPENAI_API_KEY."""
    if path is None:
        return None
    try:
        key = path.read_text().strip().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        _fail(f"--llm-api-key-file {path}: cannot read it ({getattr(e, 'strerror', None) or e})")
    if not key or not key[0].strip():
        _fail(f"--llm-api-key-file {path}: the file is empty")
    return key[0].strip()


def _print_json(data) -> None:
    import json

    typer.echo(json.dumps(data, indent=2, default=str))


def _plain_tree(value):
    """Every string in a summary (run ids, notes, configs from the ledger) without terminal controls."""
    from mart.state.text import plain

    if isinstance(value, str):
        return plain(value)
    if isinstance(value, dict):
        return {_plain_tree(k): _plain_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_tree(v) for v in value]
    return value


def _print_summary(summary: dict, ref: str | None = None) -> None:
    from rich.table import Table

    summary = _plain_tree(summary)
    console = _console()
    if summary.get("status") == "paused":
        from mart.graph.reviewers.base import format_request

        run = ref or summary["run_id"]
        if summary.get("pending_review"):  # what waits: the next candidate(s), so a reviewer sees what comes next
            console.print(format_request(summary["pending_review"]))
        console.print(f"run {run} is paused at a review: answer with `mart review {run}` (on this terminal), or "
                      f"`mart review {run} --approve | --reject TEXT | --edit KEY=VALUE`", soft_wrap=True)  # copyable
        return
    from mart.graph.figures import stage_figures
    from mart.state.units import fmt_gb

    sys_, trials = summary["system"], summary["trials"]
    table = Table(title=f"mart run {summary['run_id']}: {summary['status']}")
    table.add_column("stage")
    table.add_column("baseline", justify="right")
    table.add_column("best", justify="right")
    table.add_column("gain", justify="right")
    table.add_column("best config")

    for f in stage_figures(summary):  # the same figures and names as the report and Slack
        table.add_row(f"{f.stage} ({f.label})", f.baseline, f.best, f.gain, "\n".join(f.config) or "baseline")
        if f.hours is not None:  # what one training run costs, beside what it scores
            table.add_row(f"{f.stage} (GPU-hours of one run)", f.hours[0], f.hours[1], "", f"search: {f.hours[2]}")
    console.print(table)
    console.print(f"memory limit {fmt_gb(sys_['memory_limit_gb'], '-')}, best system peak "
                  f"{fmt_gb(sys_['best_peak_memory_gb'], '-')}; trials: {trials['total']} total, "
                  f"{trials['early_stopped']} stopped early, {trials['failed']} failed/oom")
    agents = summary.get("agents") or {}
    if agents.get("calls"):
        cost = f", ${agents['cost_usd']:.4f}" if agents.get("cost_usd") else ""
        console.print(f"LLM agents: {agents['calls']} calls, {agents['prompt_tokens']}+{agents['completion_tokens']} "
                      f"tokens{cost}, {agents['fallbacks']} fell back to rules")
    for note in summary.get("notes") or []:
        console.print(f"note: {note}", markup=False)
    if summary.get("report"):
        console.print(f"report: {summary['report']}", markup=False)


def _console():
    import sys

    from rich.console import Console

    # piped output (CI, logs) gets a wide table instead of rich's 80-column default. markup off: every
    # string shown here (run ids, configs, reasons, notes, paths) is data, and "[/x]" must print as is
    return Console(width=None if sys.stdout.isatty() else 200, markup=False, highlight=False)


def _finish(summary: dict, as_json: bool, runs_dir: str | Path = "runs") -> None:
    from mart.graph.session import OPTIONAL_SUMMARY_KEYS, SUMMARY_KEYS

    if as_json:
        keys = [*SUMMARY_KEYS, *(k for k in OPTIONAL_SUMMARY_KEYS if summary.get(k) is not None)]
        _print_json(summary if summary.get("status") == "paused" else {k: summary.get(k) for k in keys})
    else:
        _print_summary(summary, _hint_ref(summary["run_id"], runs_dir) if summary.get("run_id") else None)
    if summary.get("status") == "failed":
        from mart.state.text import one_line

        # the error quotes a trial's failure, read from its log: foreign text, one line without terminal controls
        typer.echo(f"error: the session failed: {one_line(summary.get('error'))}", err=True)
        raise typer.Exit(1)


# Flag spellings kept from before the flags were generated from TuneOptions (README and docs use them).
TUNE_FLAG_ALIASES = {
    "memory_margin": ["--margin"],
    "num_candidates": ["--candidates"],
    "wall_clock_s": ["--wall-clock"],
    "llm_timeout_s": ["--llm-timeout"],
    "llm_price_per_mtok": ["--llm-price"],
    "quiet": ["-q"],
}


@app.command()
@_one_line_errors
@model_options(TuneOptions, exclude=["backend_options", "start_overrides"], aliases=TUNE_FLAG_ALIASES, into="fields")
def tune(
    # command-line-only flags; every TuneOptions field is added as a flag by @model_options
    detach: bool = typer.Option(False, "--detach", help="Exit at the first review (same as --approve none)."),
    slack_channel: Optional[str] = typer.Option(
        None, help="With --approve slack: channel id to post reviews to (default $MART_SLACK_CHANNEL)."),
    slack_api_url: Optional[str] = typer.Option(
        None, help="Slack Web API base URL (default $MART_SLACK_API_URL, else Slack's); the token is $SLACK_BOT_TOKEN."),
    llm_api_key: Optional[str] = typer.Option(None, hidden=True, help="Refused: a key on the command line is "
                                                                      "visible to every user in the process list."),
    llm_api_key_file: Optional[Path] = typer.Option(
        None, help="File holding the API key (default $OPENAI_API_KEY); never stored, never on the command line."),
    verl_entrypoint: Optional[str] = typer.Option(None, help="verl backend: launch command."),
    verl_python: Optional[str] = typer.Option(None, help="verl backend: interpreter that runs verl."),
    base_config: Optional[Path] = typer.Option(None, help="The user's base config (verl, local): YAML/JSON of KEY: VALUE."),
    ray_address: Optional[str] = typer.Option(None, help="Run trials as Ray jobs on this cluster."),
    scenario: Optional[str] = typer.Option(None, help="sim backend: cluster scenario."),
    backend_option: list[str] = typer.Option(
        [], "--backend-option", help="KEY=VALUE passed to the backend's factory (plugins); repeatable."
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="KEY=VALUE change to the base config every stage starts from (verl key names); repeatable."),
    as_json: bool = JSON,
    fields: Optional[dict] = None,  # the TuneOptions fields, filled in by @model_options
) -> None:
    """Run a tuning session: system knobs for throughput, then learning knobs for score (the default stages),
    then, with --stages ...,schedule, a schedule of learning knobs per training segment."""
    from pydantic import ValidationError

    from mart.graph.session import tune as run_tune
    from mart.state.run_store import RunError

    if llm_api_key is not None:
        _fail("--llm-api-key: a key on the command line is visible in the process list; set $OPENAI_API_KEY or "
              "pass --llm-api-key-file PATH")
    api_key = _api_key(llm_api_key_file)
    backend_options = {"entrypoint": verl_entrypoint, "verl_python": verl_python,
                       "base_config": str(base_config) if base_config else None,
                       "ray_address": ray_address, "scenario": scenario,
                       **_backend_options(backend_option)}
    if detach:
        fields["approve"] = "none"
    from mart.state.config_values import parse_assignments

    try:
        start_overrides = parse_assignments(set_)
    except ValueError as e:
        _fail(f"--set: {e}")
    try:
        options = TuneOptions(backend_options={k: v for k, v in backend_options.items() if v is not None},
                              start_overrides=start_overrides, **fields)
    except ValidationError as e:
        flags = flag_names(TuneOptions, TUNE_FLAG_ALIASES)
        _fail("; ".join(f"{flags.get(str(err['loc'][0]), err['loc'][0]) if err['loc'] else 'options'}: {err['msg']}"
                        for err in e.errors()))
    reviewer = None
    if options.approve == "slack":
        from mart.graph.reviewers.slack import SlackConfigError, SlackReviewer

        reviewer = SlackReviewer(channel=slack_channel, api_url=slack_api_url)
        try:
            reviewer.check()
        except SlackConfigError as e:
            _fail(str(e))
    from mart.graph.stop import Interrupts

    with Interrupts().installed() as interrupts:  # until the end of the interrupted path: a second Ctrl-C counts
        try:
            summary = run_tune(options, api_key=api_key, reviewer=reviewer)
        except (RunError, ValueError) as e:
            _fail(str(e))
        except KeyboardInterrupt as e:
            _interrupted(getattr(e, "run_id", None), options.runs_dir, interrupts)
        except (OSError, sqlite3.Error) as e:
            _io_fail(e, _hint_ref("RUN", options.runs_dir))
    _finish(summary, as_json, options.runs_dir)
    if reviewer is not None and reviewer.failed:
        _fail(f"{reviewer.failed}; the run is paused", 1)


@app.command()
@_one_line_errors
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

    if approve is None and not detach and not as_json and sys.stdin.isatty() and _stored_approve(run, runs_dir) == "none":
        approve = "tty"  # a detached run resumed at a terminal: its pending review is asked here
    from mart.graph.stop import Interrupts

    with Interrupts().installed() as interrupts:  # until the end of the interrupted path: a second Ctrl-C counts
        try:
            summary = run_resume(run, runs_dir, api_key=_api_key(llm_api_key_file),
                                 approve="none" if detach else approve, quiet=quiet or None,
                                 allowed=_allowed(backend, verl_entrypoint, llm_base_url, ray_address), trust=trust_run)
        except (RunError, ValueError) as e:
            _fail(str(e))
        except KeyboardInterrupt:
            _interrupted(run, runs_dir, interrupts)
        except (OSError, sqlite3.Error) as e:
            _io_fail(e, _hint_ref(run, runs_dir))
    _finish(summary, as_json, runs_dir)


@app.command()
@_one_line_errors
def watch(
    run: str = typer.Argument(..., help="Run id (in --runs-dir) or a run directory's path."),
    runs_dir: Path = RUNS_DIR,
    interval: float = typer.Option(WATCH_INTERVAL_S, "--interval", min=0.01,
                                   help="Seconds between two reads of the trials."),
    backend: list[str] = BACKEND_AGAIN,
    verl_entrypoint: Optional[str] = ENTRYPOINT_AGAIN,
    llm_base_url: Optional[str] = LLM_URL_AGAIN,
    ray_address: Optional[str] = RAY_ADDRESS_AGAIN,
    trust_run: bool = TRUST_RUN,
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    as_json: bool = JSON,
) -> None:
    """Keep the health monitor on a paused run's trials in flight (no tuner alive: --approve none, Slack, a
    killed tuner) until they end, the run is continued, or Ctrl-C; a sick trial is stopped, the review stays open.
    """
    from mart.graph.paused_watch import watch_paused
    from mart.state.run_store import RunError
    from mart.state.text import one_line

    quiet = quiet or as_json

    def started(info: dict) -> None:
        if not quiet:
            at = f"while review #{info['review_no']} waits" if info.get("review_no") else "until the run is resumed"
            typer.echo(f"watching {len(info['watched'])} trial(s) of run {info['run_id']} in flight {at}: "
                       f"{', '.join(info['watched'])} (Ctrl-C stops watching; the trials run on)")

    def told(trial_id: str, what: str) -> None:
        if not quiet:
            typer.echo(one_line(f"{trial_id}: {'ended' if what == 'ended' else 'stopped, ' + what}"))

    from mart.graph.stop import Interrupts

    interrupts = Interrupts()
    try:
        with interrupts.installed():
            out = watch_paused(run, runs_dir, interval_s=interval, trust=trust_run, told=told, started=started,
                               allowed=_allowed(backend, verl_entrypoint, llm_base_url, ray_address))
    except (RunError, ValueError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        _fail("stopped watching; the trials in flight run on (the tuner watches them when the run continues; "
              f"`mart stop {_hint_ref(run, runs_dir)}` stops them)", 128 + (interrupts.first or 2))
    except (OSError, sqlite3.Error) as e:
        _io_fail(e, _hint_ref(run, runs_dir))
    if as_json:
        _print_json(out)
    elif not quiet:
        typer.echo({"no trial in flight": f"run {out['run_id']}: no trial in flight, nothing to watch",
                    "every trial ended": "every trial watched has ended; the run takes them in when it continues",
                    "the run moved on": "the run is being continued: its tuner watches the trials now"}.get(
                        out["why"], "stopped watching"))


def _interrupted(run: str | None, runs_dir: str | Path, interrupts) -> None:
    """A signal stopped a command driving ``run``: say what runs on (``mart.graph.stop.after_interrupt``), exit."""
    interrupts.stopping = True  # from now on a second Ctrl-C is counted (it stops the trials), not raised
    from mart.graph.stop import after_interrupt

    if run is None:
        _fail("interrupted before the run was created; nothing was saved", 128 + (interrupts.first or 2))
    with interrupts.installed():  # (again, where the command's block has ended): a second Ctrl-C is counted
        code = after_interrupt(run, runs_dir, interrupts, lambda line: typer.echo(line, err=True))
    raise typer.Exit(code)


@app.command()
@_one_line_errors
def stop(
    run: str = typer.Argument(..., help="Run id (in --runs-dir) or a run directory's path."),
    runs_dir: Path = RUNS_DIR,
    grace: float = typer.Option(5.0, "--grace", min=0.0, help="Seconds between SIGTERM and SIGKILL."),
) -> None:
    """Stop a run's trials in flight (after a Ctrl-C, a killed tuner, or while the run waits at a review).

    Only processes mart can prove it started are signalled (their launch token); the run stays as it is: `mart
    resume` continues it and reads each stopped trial's end from its folder.
    """
    from mart.graph.stop import stop_run
    from mart.state.run_store import RunError, RunLocked
    from mart.state.text import one_line

    try:
        store, results = stop_run(run, runs_dir, grace)
    except RunLocked as e:
        _fail(f"{e} Stop its tuner first (Ctrl-C; a second Ctrl-C stops its trials too)")
    except RunError as e:
        _fail(str(e))
    if not results:
        typer.echo(one_line(f"run {store.run_id}: no trial in flight, nothing to stop"))
        return
    for trial_id, what in results:
        typer.echo(one_line(f"{trial_id}: {what}"))
    if any("still runs" in what or "left alone" in what for _, what in results):  # not everything stopped
        raise typer.Exit(1)


def _stored_approve(run: str, runs_dir: Path) -> str | None:
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


@app.command()
@_one_line_errors
def review(
    run: str = typer.Argument(..., help="Run id or run directory."),
    runs_dir: Path = RUNS_DIR,
    approve_: bool = typer.Option(False, "--approve", help="Approve the pending candidate(s)."),
    reject: Optional[str] = typer.Option(None, "--reject", help="Reject with this feedback for the proposer."),
    edit: list[str] = typer.Option([], "--edit", help="Edit KEY=VALUE (repeatable), then run it."),
    ask: Optional[str] = typer.Option(None, "--ask", help="Ask the agents a question about the candidate(s); the "
                                      "review stays pending and shows their answer."),
    candidate: Optional[str] = typer.Option(
        None, "--candidate", help="The candidate (id from `mart status`) the decision is about, when the review "
        "covers several (one per free trial slot); default: all of them."),
    others: Optional[str] = typer.Option(
        None, "--others", help="With --candidate: what happens to the review's other candidates, approve or reject "
        "(default: you must decide them too, so none is approved unseen)."),
    reviewer: Optional[str] = typer.Option(None, help="Who decides (default: your user name)."),
    review_no: Optional[int] = typer.Option(
        None, "--review", help="Answer only if review #N is the pending one (scripts: never approve a review unseen)."),
    interrupt: Optional[str] = typer.Option(
        None, "--interrupt", help="Answer only if this interrupt id (from `mart status --json`) is pending."),
    backend: list[str] = BACKEND_AGAIN,
    verl_entrypoint: Optional[str] = ENTRYPOINT_AGAIN,
    llm_base_url: Optional[str] = LLM_URL_AGAIN,
    ray_address: Optional[str] = RAY_ADDRESS_AGAIN,
    trust_run: bool = TRUST_RUN,
    detach: bool = typer.Option(False, "--detach", help="After answering, exit again at the next review."),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    as_json: bool = JSON,
) -> None:
    """Answer a run's pending review (interactive without flags) and continue the run.

    Without flags the review is asked on this terminal, and so are the run's later reviews (unless
    --detach). With a flag, later reviews go to the run's own channel (--detach: exit at the next one).
    The decision applies only to the review shown (and to --review N / --interrupt ID when given): if
    another one is pending by the time it is applied, nothing changes.
    """
    import getpass
    import sys

    from mart.graph.reviewers.base import TTYReviewer, format_request
    from mart.graph.session import pending_review
    from mart.graph.session import resume as run_resume
    from mart.graph.stop import Interrupts
    from mart.state.config_values import parse_assignments
    from mart.state.models import CandidateDecision, ReviewDecision
    from mart.state.run_store import RunError, RunStore
    from mart.state.search_space import ConfigError

    chosen = [approve_, reject is not None, bool(edit), ask is not None]
    if sum(chosen) > 1:
        _fail("give one of --approve, --reject, --edit or --ask")
    if others is not None and others not in ("approve", "reject"):
        _fail(f"--others: approve or reject, not {others!r}")
    if others is not None and candidate is None:
        _fail("--others goes with --candidate ID")
    who = reviewer or getpass.getuser()
    decision, channel, interrupts = None, None, Interrupts()
    out = sys.stderr if as_json else sys.stdout  # keep --json output clean
    try:
        store = RunStore.open(run, runs_dir, readonly=True)
        try:
            request = pending_review(store)
            state = (store.ledger.run(store.run_id) or {}).get("status")
        finally:
            store.close()
        if request is None:
            _fail(f"run {store.run_id} ({state}) has no pending review (see `mart status {store.ref}`)")
        if review_no is not None and request.get("review_no") != review_no:
            _fail(f"run {store.run_id}: the pending review is #{request.get('review_no')}, not #{review_no}; "
                  "nothing changed")
        if interrupt is not None and request["interrupt_id"] != interrupt:
            _fail(f"run {store.run_id}: the pending review's interrupt is {request['interrupt_id']}, not "
                  f"{interrupt}; nothing changed")
        interrupt_id = request["interrupt_id"]
        ids = [c.get("candidate_id") for c in request.get("candidates") or []]
        if candidate is not None and candidate not in ids:
            _fail(f"run {store.run_id}: review #{request.get('review_no')} has no candidate {candidate} "
                  f"(its candidates: {', '.join(map(str, ids))}); nothing changed")
        one = None
        if approve_:
            one = CandidateDecision(type="approve", candidate_id=candidate)
        elif reject is not None:
            one = CandidateDecision(type="reject", candidate_id=candidate, message=reject)
        elif edit:
            one = CandidateDecision(type="edit", candidate_id=candidate, edits=parse_assignments(edit))
        elif ask is not None:
            one = CandidateDecision(type="respond", candidate_id=candidate, message=ask)
            detach = True  # the review stays pending, with the agents' answer
        if one is not None:
            rest = [] if others is None else [CandidateDecision(type=others)]
            decision = ReviewDecision(decisions=[one, *rest], reviewer=who, channel="cli")
            if one.type != "respond" and candidate is not None and others is None and len(ids) > 1:
                rest_ids = ", ".join(str(c) for c in ids if c != candidate)
                _fail(f"run {store.run_id}: review #{request.get('review_no')} also holds {rest_ids}: add "
                      "--others approve|reject to decide them in the same answer (or leave out --candidate to "
                      "decide all); nothing changed")
            if one.type != "respond":
                decision.for_candidates(ids)  # every candidate decided, before anything is sent
        if decision is not None:  # say what is being decided: the applied answer is pinned to this review
            out.write(format_request(request) + f"\n-> {decision.describe()} (interrupt {interrupt_id})\n")
            out.flush()
        else:  # interactive: ask now, answer exactly this review (unless someone else answers it first)
            tty = TTYReviewer(stdout=out)
            decision = tty.review(request)
            if decision is None:
                _finish({"run_id": store.run_id, "status": "paused", "pending_review": request}, as_json, runs_dir)
                return
            if reviewer:
                decision = decision.model_copy(update={"reviewer": reviewer})
            channel = None if detach else tty
        with interrupts.installed():
            summary = run_resume(run, runs_dir, decision=decision, interrupt_id=interrupt_id, reviewer=channel,
                                 approve="none" if detach else None, quiet=quiet or None,
                                 allowed=_allowed(backend, verl_entrypoint, llm_base_url, ray_address),
                                 trust=trust_run)
    except (RunError, ConfigError, ValueError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        _interrupted(run, runs_dir, interrupts)
    except (OSError, sqlite3.Error) as e:
        _io_fail(e, _hint_ref(run, runs_dir))
    _finish(summary, as_json, runs_dir)


def _list_runs(runs_dir: Path, pending_only: bool, as_json: bool) -> None:
    from rich.table import Table

    from mart.graph.run_status import run_status
    from mart.state.ledger import DB_FILE
    from mart.state.run_store import RunError, RunStore, run_ref
    from mart.state.text import one_line

    if runs_dir.exists() and not runs_dir.is_dir():
        _fail(f"--runs-dir {runs_dir} is not a directory")
    infos = []
    for path in sorted(p for p in runs_dir.glob("*") if not p.name.startswith(".") and (p / DB_FILE).exists()):
        try:
            store = RunStore.open(path, runs_dir, readonly=True)
            try:
                infos.append(run_status(store))
            finally:
                store.close()
        except RunError:
            continue
    if pending_only:
        infos = [i for i in infos if i["pending_review"]]
    if as_json:
        _print_json(infos)
        return
    if not infos:
        typer.echo(f"no {'pending reviews' if pending_only else 'runs'} in {runs_dir}")
        return
    table = Table(title=one_line(f"runs in {runs_dir}"))
    for col in ("run", "status", "stage", "trials", "pending review", "answer with"):
        table.add_column(col)
    for i in infos:
        req = i["pending_review"]
        cells = (i["run_id"], i["status"] + (f" ({i['waiting_for']})" if i["waiting_for"] else ""),
                 i["stage"] or "-", str(sum((i["trials_done"] or {}).values())),
                 _review_cell(req) if req else "-",
                 f"mart review {run_ref(i['run_dir'], runs_dir)}" if req else
                 f"LangGraph Studio (thread {i['thread_id']})" if i.get("driver") == "studio" and i["status"] == "paused"
                 else "")
        table.add_row(*map(one_line, cells))  # run folders are foreign: no terminal controls
    _console().print(table)


def _review_cell(req: dict) -> str:
    cands = req.get("candidates") or []
    if len(cands) == 1:
        return f"#{req['review_no']} {cands[0].get('candidate_id')} ({len(cands[0].get('diff') or [])} changes)"
    return f"#{req['review_no']} {len(cands)} candidates"


@app.command()
@_one_line_errors
def status(
    run: Optional[str] = typer.Argument(None, help="Run id or run directory (default: list the runs)."),
    runs_dir: Path = RUNS_DIR,
    pending: bool = typer.Option(False, "--pending", help="Without RUN: only runs waiting for a review."),
    as_json: bool = JSON,
) -> None:
    """Where a run stands: running, paused (at a review, or waiting for resume), completed, failed.

    Without RUN: every run in --runs-dir with its pending review, if any.
    """
    from mart.graph.reviewers.base import format_request
    from mart.graph.run_status import run_status
    from mart.state.run_store import RunError, RunStore
    from mart.state.text import one_line

    if run is None:
        _list_runs(runs_dir, pending, as_json)
        return
    try:
        store = RunStore.open(run, runs_dir, readonly=True)  # status never writes: read-only media work
        try:
            info = run_status(store)
        finally:
            store.close()
    except RunError as e:
        _fail(str(e))
    if as_json:
        _print_json(info)
        return
    # every line below shows text from the run folder (foreign): without terminal controls
    typer.echo(one_line(f"run {info['run_id']}: {info['status']}"
               + (f" (waiting for {info['waiting_for']})" if info["waiting_for"] else "")
               + (f", stage {info['stage']}" if info["stage"] else "")
               + ", trials done: " + (", ".join(f"{k} {v}" for k, v in (info["trials_done"] or {}).items()) or "none")))
    running = info.get("running_trials") or ([info["running_trial"]] if info.get("running_trial") else [])
    for t in running:  # every trial in flight (several with --parallel)
        slot = f", slot {t['slot'] + 1}" if t.get("slot") is not None and (info.get("slots") or 1) > 1 else ""
        where = f"queued ({t['queued']})" if t.get("queued") else f"{t['steps_done']}/{t['horizon']} steps"
        disk, label = t.get("on_disk") or {}, "running trial"
        ended = disk.get("ended")
        if not info.get("driver_pid") and (ended or (disk.get("steps") or 0) > t["steps_done"]):
            # no tuner reads the trial now: its own folder is newer than the ledger
            label = "trial" if ended else label
            where = ((f"ended ({ended}), " if ended else "") + f"{disk.get('steps', 0)}/{t['horizon']} steps in its "
                     "folder; the ledger takes it in when the run continues")
        typer.echo(one_line(f"{label} {t['trial_id']} ({t['kind']}, {t['stage']}{slot}): {where}"))
    if not info.get("driver_pid") and any(not (t.get("on_disk") or {}).get("ended") for t in running):
        typer.echo(one_line(f"the trials in flight are watched by `mart watch` (pid {info['watcher_pid']})"
                            if info.get("watcher_pid") else f"no tuner watches the trials in flight: "
                            f"`mart watch {store.ref}` keeps the health monitor on them, `mart stop {store.ref}` "
                            "stops them"))
    if info["pending_review"]:
        typer.echo("pending review:\n" + format_request(info["pending_review"]))
    if info["error"]:
        typer.echo(one_line(f"error: {info['error']}"))
    lost = store.untracked_trials()
    if lost:  # the ledger is behind its trial folders: what status shows is older than what ran
        typer.echo(one_line(f"warning: trial folders the ledger does not know: {', '.join(lost)} (mart.sqlite-wal "
                            f"lost after a kill?); `mart resume {store.ref}` refuses this run until that is resolved"))
    report = store.run_dir / "report.html"
    if report.is_file():
        typer.echo(one_line(f"report: {report}"))


@app.command()
@_one_line_errors
def report(
    run: str = typer.Argument(..., help="Run id or run directory."),
    runs_dir: Path = RUNS_DIR,
    fmt: str = typer.Option("html", "--format", help="html (self-contained page) or md (Markdown for a terminal or CI)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where to write the page (default: RUN/report.html or .md)."),
) -> None:
    """Write the run's report: best-so-far, phase breakdown, memory, calibration, learning curves, reviews, config.

    The figures are PNGs in RUN/report/, embedded in the HTML page so it stands alone.
    """
    from mart.graph.report import write_report
    from mart.state.run_store import RunError, RunStore

    if fmt not in ("html", "md"):
        _fail(f"--format must be html or md, got {fmt!r}")
    try:
        store = RunStore.open(run, runs_dir, contained=False)  # reads the run, writes only its report
        run_dir = store.run_dir
        store.close()
        path = write_report(run_dir, fmt, out)
    except RunError as e:
        _fail(str(e))
    except (OSError, sqlite3.Error) as e:  # a full disk, a read-only folder, a planted link: nothing half-written
        _fail(f"cannot write the report: {_os_cause(e)}", 1)
    typer.echo(str(path))


@app.command()
@_one_line_errors
def export(
    run: str = typer.Argument(..., help="Run id or run directory."),
    runs_dir: Path = RUNS_DIR,
    schedule: bool = typer.Option(False, "--schedule", help="Export the schedule (stage 3) instead of the final config."),
    fmt: str = typer.Option("yaml", "--format", help="yaml, json, or sh: a bash script launching verl with the final "
                            "config (with --schedule: one verl launch per segment), your base overrides as its "
                            "arguments."),
    checkpoint_dir: str = typer.Option("checkpoints/mart-schedule", help="--schedule: where the segments' verl "
                                       "launches keep and resume their checkpoints."),
) -> None:
    """Print what the run found as your next training config: the final config's overrides, or (--schedule) the
    per-segment schedule and the verl launch of each segment, resuming from the previous one's checkpoint."""
    from mart.graph.export import config_script, final_config, render, schedule_document
    from mart.graph.report import as_yaml
    from mart.state.run_store import RunError, RunStore

    if fmt not in ("yaml", "json", "sh"):
        _fail(f"--format must be yaml, json or sh, got {fmt!r}")
    try:
        store = RunStore.open(run, runs_dir, readonly=True)
    except RunError as e:
        _fail(str(e))
    try:
        row = store.ledger.run(store.run_id) or {}
    finally:
        store.close()
    summary, options = row.get("summary") or {}, row.get("options") or {}
    if row.get("status") != "completed" or not summary:
        _fail(f"run {store.run_id} is {row.get('status') or 'not started'}: nothing to export yet")
    if schedule:
        try:
            typer.echo(render(schedule_document(summary, options, checkpoint_dir), fmt), nl=False)
        except ValueError as e:
            _fail(str(e))
        return
    if fmt == "sh":
        typer.echo(config_script(summary, options), nl=False)
        return
    config = final_config(summary, options)
    typer.echo(json.dumps(config, indent=2) if fmt == "json" else as_yaml(config), nl=fmt != "json")


@app.command()
def knobs(
    backend: str = typer.Option("local", "--backend", help="local, verl, sim, or package.module:factory."),
    stage: Optional[str] = typer.Option(None, "--stage", help="system or learning (default: both)."),
    as_json: bool = JSON,
    backend_option: list[str] = typer.Option(
        [], "--backend-option", help="KEY=VALUE passed to the backend's factory (e.g. workflow=debate); repeatable."
    ),
) -> None:
    """The knob catalogue a reviewer edits: key, short name, type and range, default, phase, why it matters.

    An edit (`mart review RUN --edit NAME=VALUE`, Slack, the terminal) takes the full key, a unique dotted
    suffix (rollout.gpu_memory_utilization) or the short name shown here (micro_batch).
    """
    from rich.table import Table

    from mart.trial_runner.registry import load_backend

    if stage not in (None, "system", "learning"):
        _fail(f"--stage must be system or learning, got {stage!r}")
    try:
        space = load_backend(backend, **_backend_options(backend_option)).search_space()
    except (ValueError, TypeError) as e:
        _fail(str(e))
    from mart.nodes.agents.knob_effects import knob_facts
    from mart.state.agents import knob_agent

    params = [knob_facts(p) for p in space.params if stage is None or p.stage == stage]  # what the agents know of each
    # a multi-agent job's knobs: the shared ones first, then each agent's (agents.<i>.*) together
    params.sort(key=lambda p: -1 if knob_agent(p.key) is None else knob_agent(p.key))
    if as_json:
        _print_json([{**p.to_dict(), "short": space.edit_name(p.key), "phase": p.phase, "agent": knob_agent(p.key)}
                     for p in params])
        return
    per_agent = any(knob_agent(p.key) is not None for p in params)
    console = _console()
    key_w = max((len(p.key) for p in params), default=3)
    short_w = max((len(space.edit_name(p.key)) for p in params), default=5)
    if console.width < key_w + short_w + 70:  # too narrow for a table whose keys stay whole: one block per knob
        for p in params:
            agent = knob_agent(p.key)
            console.print(p.key + (f"  ({space.edit_name(p.key)})" if space.edit_name(p.key) != p.key else ""),
                          soft_wrap=True, style="bold")
            console.print(f"  {'shared, ' if per_agent and agent is None else f'agent {agent}, ' if per_agent else ''}"
                          f"{p.stage} stage, {p.range_text()}, default {p.default!r}, phase {p.phase}")
            console.print(f"  {p.description}")
        return
    table = Table(title=f"{space.backend} knobs" + (f" ({stage} stage)" if stage else ""), show_lines=False)
    for col in ("agent",) * per_agent + ("key", "short", "stage", "range", "default", "phase", "why"):
        if col in ("key", "short"):  # whole, never wrapped: a reviewer copies them into --edit; the others give way
            table.add_column(col, no_wrap=True, min_width=max(key_w if col == "key" else short_w, len(col)))
        else:
            table.add_column(col, overflow="fold")
    for i, p in enumerate(params):
        agent = knob_agent(p.key)
        if per_agent and i and agent != knob_agent(params[i - 1].key):
            table.add_section()
        first = ("shared" if agent is None else str(agent),) * per_agent
        table.add_row(*first, p.key, space.edit_name(p.key), p.stage, p.range_text(), repr(p.default), p.phase,
                      p.description)
    console.print(table, markup=False)


@app.command()
@_one_line_errors
def trials(
    run: str = typer.Argument(..., help="Run id or run directory."),
    runs_dir: Path = RUNS_DIR,
    as_json: bool = JSON,
) -> None:
    """The run's trials from the ledger."""
    from rich.table import Table

    from mart.graph.figures import knob_text
    from mart.state.run_store import RunError, RunStore
    from mart.state.text import one_line

    try:
        store = RunStore.open(run, runs_dir, readonly=True)
    except RunError as e:
        _fail(str(e))
    try:
        rows = store.ledger.trials()
    finally:
        store.close()
    if as_json:
        _print_json(rows)
        return
    table = Table(title=f"trials of {one_line(store.run_id)}")
    for col in ("trial", "stage", "kind", "status", "steps", "tok/s", "peak GB", "score", "changes / reason"):
        table.add_column(col)
    for r in rows:
        def f(v, spec=".4g"):
            return "-" if v is None else format(v, spec)
        changes = knob_text(r.get("overrides"))
        if r.get("parent_trial"):  # a schedule branch: from its parent's checkpoint
            changes = f"{changes or 'unchanged'} (from {r['parent_trial']} @ {r.get('parent_step')})"
        cells = (r["trial_id"], r["stage"], r["kind"], r["status"] + (" (early)" if r["early_stopped"] else ""),
                 str(r.get("steps_done") or 0), f(r.get("throughput"), ".1f"), f(r.get("peak_memory_gb"), ".3g"),
                 f(r.get("score"), ".3f"), changes or (r.get("reason") or "baseline"))
        table.add_row(*map(one_line, cells))  # ledger text is foreign: no terminal controls
    _console().print(table)


# -- Slack ------------------------------------------------------------------------------------------
slack_app = typer.Typer(help="Review from Slack: `mart tune --approve slack` posts, `mart slack serve` receives.",
                        no_args_is_help=True)
app.add_typer(slack_app, name="slack")


@slack_app.command("serve")
def slack_serve(
    mode: str = typer.Option("socket", help="socket: dial out to Slack (Socket Mode, $SLACK_APP_TOKEN; no public "
                                            "URL needed); http: receive Slack's requests on HOST:PORT."),
    port: int = typer.Option(3000, min=0, max=65535, help="Port (0: any free port, printed at start)."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; put a TLS proxy or tunnel in front for Slack."),
    runs_dir: Path = RUNS_DIR,
    reviewer: list[str] = typer.Option([], "--reviewer", help="Slack user id allowed to decide (repeatable; "
                                                               "also $MART_SLACK_REVIEWERS, comma-separated)."),
    api_url: Optional[str] = typer.Option(None, help="Slack Web API base URL (default $MART_SLACK_API_URL)."),
    allow_backend: list[str] = typer.Option(
        [], "--allow-backend", help="Plugin backend spec, launch command or endpoint (LLM base URL, Ray address) "
                                    "the runs may name (repeatable; also $MART_ALLOWED_BACKENDS); builtin backends "
                                    "need none."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log each decision (never secrets or headers)."),
) -> None:
    """Receive Slack's Approve / Edit / Reject clicks: Socket Mode (default) or HTTP (request URL:
    http://HOST:PORT/slack/events behind your TLS proxy).

    Secrets from the environment only: SLACK_BOT_TOKEN, and SLACK_APP_TOKEN (socket) or SLACK_SIGNING_SECRET (http).
    """
    import logging

    from mart.graph.reviewers.slack import SlackConfigError
    from mart.graph.slack_server import serve

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(runs_dir, host=host, port=port, reviewers=reviewer, api_url=api_url, allowed_backends=allow_backend,
              mode=mode)
    except (SlackConfigError, OSError) as e:
        _fail(str(e))
    except Exception as e:  # bolt's start-up check of the token (auth.test) and the like
        _fail(f"{type(e).__name__}: {e}")


if __name__ == "__main__":  # pragma: no cover
    app()
