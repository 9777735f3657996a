"""Build the proposer and critic strategies a session asked for (``rules`` or ``llm``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mart.nodes.agents.base import Critic, Proposer

if TYPE_CHECKING:
    from mart.state.options import TuneOptions


def make_proposer(options: "TuneOptions", api_key: str | None = None) -> Proposer:
    from mart.nodes.agents.rules import RulesProposer

    if options.proposer_strategy() == "rules":
        return RulesProposer()
    from mart.nodes.agents.llm import LLMProposer

    return LLMProposer(options, api_key=api_key, fallback=RulesProposer())


def make_critic(options: "TuneOptions", api_key: str | None = None) -> Critic:
    from mart.nodes.agents.rules import RulesCritic

    if options.critic_strategy() == "rules":
        return RulesCritic()
    from mart.nodes.agents.llm import LLMCritic

    return LLMCritic(options, api_key=api_key, fallback=RulesCritic())
