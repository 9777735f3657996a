"""The ``mart`` command line (typer): one module per group of commands, registered here on one app.

Subcommands stay thin: they parse, then call library functions; each imports what it needs when it runs, so a
quick answer (`mart status`, a refused flag) loads no heavy library.
"""

from __future__ import annotations

import typer

from mart.graph.cli import configs, results, review, runs, slack, trial, tune
from mart.graph.cli.app import app

# the order of `mart --help`: running, driving and answering a session, reading it, then the config tools
for _name, _command in (("trial", trial.trial), ("memory", configs.memory), ("import-verl", configs.import_verl),
                        ("tune", tune.tune), ("resume", tune.resume), ("watch", runs.watch), ("stop", runs.stop),
                        ("review", review.review), ("status", runs.status), ("report", results.report),
                        ("export", results.export), ("knobs", configs.knobs), ("trials", runs.trials)):
    app.command(_name)(_command)

slack_app = typer.Typer(help="Review from Slack: `mart tune --approve slack` posts, `mart slack serve` receives.",
                        no_args_is_help=True)
slack_app.command("serve")(slack.slack_serve)
app.add_typer(slack_app, name="slack")

__all__ = ["app"]
