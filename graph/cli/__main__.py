"""``python -m mart.graph.cli``: the ``mart`` command."""

from mart.graph.cli import app

app()
