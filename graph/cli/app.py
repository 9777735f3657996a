"""The ``mart`` typer application and its one-line refusal of a bad command line; the commands are
registered on it by ``mart.graph.cli``."""

from __future__ import annotations

import typer


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
