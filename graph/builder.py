"""The tuning graph. ``builder`` is the uncompiled StateGraph; compile it with or without a checkpointer.

Every node returns ``Command(goto=...)``, so the edges are declared by the nodes' return types; the
wiring below only names the nodes and the entry point.
"""

from __future__ import annotations

from langgraph.graph import START, StateGraph

import mart.graph.services  # noqa: F401  (registers the services factory for context-less runs)
from mart.nodes.critic import critic
from mart.nodes.human_review import human_review
from mart.nodes.profiler import profiler
from mart.nodes.proposer import proposer
from mart.nodes.runtime import Services
from mart.nodes.stage_control import finish, stage_control, start_session
from mart.state.graph_state import InputState, TuningState
from mart.tools.collect import collect_trial
from mart.tools.launch import launch_trial
from mart.tools.stop import stop_trial
from mart.tools.watch import watch_trial


def make_builder(*, context_schema: type | None = Services, input_schema: type = InputState) -> StateGraph:
    """The uncompiled graph. Studio builds it with ``context_schema=None``: ``Services`` holds live objects
    that have no JSON schema, and Studio passes no context (the nodes build services from the state)."""
    builder = StateGraph(TuningState, context_schema=context_schema, input_schema=input_schema)
    builder.add_node("start", start_session)  # first step: counters, ledger run row
    builder.add_node("stage_control", stage_control)  # the stage protocol: fill free slots, wait, next stage
    builder.add_node("profiler", profiler)  # each stage's baseline -> its phase profile
    builder.add_node("proposer", proposer)  # candidates for the free slots from profile, history, feedback
    builder.add_node("critic", critic)  # constraints, memory model, duplicates; pick a batch or send back
    builder.add_node("human_review", human_review)  # interrupt: approve / edit / reject / ask, per candidate
    builder.add_node("launch_trial", launch_trial)  # tool: idempotent launch of the queued trials (ledger first)
    builder.add_node("watch_trial", watch_trial)  # tool: every trial in flight -> ledger, progress, health monitor
    builder.add_node("stop_trial", stop_trial)  # tool: SIGTERM / grace / SIGKILL of the sick or hung ones
    builder.add_node("collect_trial", collect_trial)  # tool: final status, objective, the stage's best
    builder.add_node("finish", finish)  # summary
    builder.add_edge(START, "start")
    return builder


builder = make_builder()


def compile_graph(checkpointer=None):
    """The compiled graph; the session driver passes its SqliteSaver, Studio passes none."""
    return builder.compile(checkpointer=checkpointer, name="mart")
