"""Builds the runtime context (``mart.nodes.runtime.Services``) of a session from its options.

The graph layer owns construction because it is the only layer that may see everything: the backend
registry, the agents' factories and the run store. Importing this module also registers the builder as
the fallback for runs without a runtime context (LangGraph Studio).
"""

from __future__ import annotations

from mart.nodes.agents.registry import make_critic, make_proposer
from mart.nodes.runtime import Services, register_services_factory
from mart.state.options import TuneOptions, backend_options
from mart.state.run_store import RunStore
from mart.trial_runner.registry import ALLOW_ENV, allowed_from_env, load_backend, untrusted_parts

__all__ = ["backend_options", "build_services"]  # backend_options: mart.state.options's, kept importable here


def build_services(options: TuneOptions, store: RunStore, api_key: str | None = None) -> Services:
    backend = load_backend(options.backend, **backend_options(options))
    return Services(
        options=options,
        store=store,
        backend=backend,
        runner=backend.make_runner(),
        proposer=make_proposer(options, api_key=api_key),
        critic=make_critic(options, api_key=api_key),
    )


def _services_from_state(options: TuneOptions, store: RunStore, api_key: str | None = None) -> Services:
    """For runs without a runtime context (LangGraph Studio, a notebook's ``graph.invoke``): the options
    come from a thread's state, so the backend must be builtin or in ``$MART_ALLOWED_BACKENDS``, read when
    the server starts a run (see ``mart.trial_runner.registry.untrusted_parts``)."""
    parts = untrusted_parts(options.backend, options.backend_options, allowed_from_env())
    if parts:
        raise ValueError(f"run {store.run_id} names {', '.join(parts)}, which this server does not allow: "
                         f"add it to ${ALLOW_ENV} (comma-separated) before starting the server")
    return build_services(options, store, api_key=api_key)


register_services_factory(_services_from_state)
