"""`mart slack serve`: receive Slack's review clicks."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mart.graph.cli.errors import fail
from mart.graph.cli.flags import RUNS_DIR


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
        fail(str(e))
    except Exception as e:  # bolt's start-up check of the token (auth.test) and the like
        fail(f"{type(e).__name__}: {e}")
