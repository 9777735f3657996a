"""The commands about a training config before any tuning: `mart memory`, `mart import-verl`, `mart knobs`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mart.graph.cli.errors import fail, one_line_errors
from mart.graph.cli.flags import JSON, parse_backend_options
from mart.graph.cli.output import new_console, print_json


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
        fail(str(e))
    if as_json:
        print_json(result)
    else:
        typer.echo(render(result))


@one_line_errors
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
        fail(str(e))
    if not imported.overrides:  # nothing to tune from: say why instead of writing an empty config
        typer.echo(imported.report(), err=True)
        fail(f"{script}: the verl command on line {imported.line} yields 0 overrides; nothing written", 1)
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
            fail(f"{out} exists; choose a new --out")
        out.write_text(text)
        typer.echo(f"wrote {out}: use it with --base-config {out}", err=True)


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
        fail(f"--stage must be system or learning, got {stage!r}")
    try:
        space = load_backend(backend, **parse_backend_options(backend_option)).search_space()
    except (ValueError, TypeError) as e:
        fail(str(e))
    from mart.nodes.knob_effects import knob_facts
    from mart.state.agents import knob_agent

    params = [knob_facts(p) for p in space.params if stage is None or p.stage == stage]  # what the agents know of each
    # a multi-agent job's knobs: the shared ones first, then each agent's (agents.<i>.*) together
    params.sort(key=lambda p: -1 if knob_agent(p.key) is None else knob_agent(p.key))
    if as_json:
        print_json([{**p.to_dict(), "short": space.edit_name(p.key), "phase": p.phase, "agent": knob_agent(p.key)}
                     for p in params])
        return
    per_agent = any(knob_agent(p.key) is not None for p in params)
    console = new_console()
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
