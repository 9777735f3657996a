"""Options several commands share: the runs folder, --json, the backend flags, what a stored run may use."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from pydantic import BaseModel, Field

from mart.graph.cli.errors import fail
from mart.graph.cli_options import model_options

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


def allowed(backends: list[str], *named: str | None) -> set[str]:
    """What the user names again for a stored run: plugin specs, a launch command, endpoints."""
    return {*backends, *(x for x in named if x)}


def api_key(path: Path | None) -> str | None:
    """The LLM API key from a file (first line); None: the agents read $OPENAI_API_KEY."""
    if path is None:
        return None
    try:
        key = path.read_text().strip().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"--llm-api-key-file {path}: cannot read it ({getattr(e, 'strerror', None) or e})")
    if not key or not key[0].strip():
        fail(f"--llm-api-key-file {path}: the file is empty")
    return key[0].strip()


class BackendFlags(BaseModel):
    """The flags that configure a trial's backend, for `mart trial` and `mart tune` alike (``backend_flags``)."""

    verl_entrypoint: Optional[str] = Field(
        None, description="verl backend: the command that launches verl (default: python -m verl.trainer.main_ppo).")
    verl_python: Optional[str] = Field(
        None, description="verl backend: the interpreter that runs verl (default: this one; 'python' on Ray nodes).")
    base_config: Optional[str] = Field(
        None, description="The user's base config (verl, local): YAML/JSON of KEY: VALUE.")
    ray_address: Optional[str] = Field(None, description="Run trials as Ray jobs on this cluster (http://HEAD:8265).")
    scenario: Optional[str] = Field(None, description="sim backend: the cluster scenario (e.g. qwen3-8b-1x8).")
    backend_option: list[str] = Field(
        [], description="KEY=VALUE passed to the backend's factory (plugins); repeatable.",
        json_schema_extra={"repeatable": True})

    def backend_options(self, **extra) -> dict:
        """What the backend's factory receives: ``extra`` (a command's own), the flags given (the launch command
        as ``entrypoint``), then each --backend-option; a value left unset is left out."""
        given = {**extra, "entrypoint": self.verl_entrypoint, "verl_python": self.verl_python,
                 "base_config": self.base_config, "ray_address": self.ray_address, "scenario": self.scenario,
                 **parse_backend_options(self.backend_option)}
        return {k: v for k, v in given.items() if v is not None}


# a command taking the backend flags receives them as one dict in its parameter ``backend_flags``; its own
# options (--backend first) come before them in --help
backend_flags = model_options(BackendFlags, into="backend_flags", own_first=True)


def parse_backend_options(items: list[str]) -> dict:
    from mart.state.config_values import parse_assignments

    try:
        return parse_assignments(items)
    except ValueError as e:
        typer.echo(f"error: --backend-option: {e}", err=True)
        raise typer.Exit(2) from None
