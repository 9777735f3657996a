"""LangGraph Studio's entry (``langgraph.json``): the tuning graph compiled *without* a checkpointer.

The Studio server (``langgraph dev``) persists threads itself and refuses a graph that brings its own
checkpointer. A Studio run starts from ``{"options": {...}}`` (``graph.context.TuneOptions`` as JSON);
the start node creates its run directory ``<runs_dir>/studio-<thread id>`` for the ledger and trials, and
the nodes build their services from the state (Studio passes no runtime context, so the graph is built
without a context schema: ``Services`` holds live objects that have no JSON schema). Studio answers the
review interrupt itself: resume with a ``ReviewDecision`` as JSON, e.g. ``{"action": "approve"}``.
"""

from __future__ import annotations

from mart.graph.builder import make_builder

graph = make_builder(context_schema=None).compile(name="mart")
