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
from mart.graph.session import STRICT_RESUME
from mart.state.graph_state import InputState
from mart.state.options import TuneOptions


class StudioInput(InputState, total=False):
    """Studio's input form: ``options`` as the typed ``TuneOptions`` (one field per option, with its type,
    default and description) instead of a free-form object. Only the schema changes: the value still reaches
    the graph as the JSON dict Studio sends, and the nodes validate it (unknown keys refused)."""

    options: TuneOptions  # type: ignore[misc]  # narrows InputState's dict for the form


#: LangGraph's strict resume mode on Studio's own server too (langgraph-api 0.16 does not apply the SDK's
#: ``strict_resume`` yet): an answer to a review that is no longer pending (an old form, a second click) fails the run
#: with ``UnknownInterruptError`` and the thread stays as it was, instead of the answer being dropped silently
graph = make_builder(context_schema=None, input_schema=StudioInput).compile(name="mart").with_config(
    configurable={STRICT_RESUME: True})
