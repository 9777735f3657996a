"""Build the proposer and critic strategies a session asked for (``rules`` or ``llm``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mart.nodes.agents.base import Critic, Proposer
from mart.nodes.agents.llm import LLMCritic, LLMProposer
from mart.nodes.agents.rules import RulesCritic, RulesProposer

if TYPE_CHECKING:
    from mart.state.options import TuneOptions


def make_proposer(options: "TuneOptions", api_key: str | None = None) -> Proposer:
    if options.proposer_strategy() == "rules":
        return RulesProposer()

    return LLMProposer(options, api_key=api_key, fallback=RulesProposer())


def make_critic(options: "TuneOptions", api_key: str | None = None) -> Critic:
    if options.critic_strategy() == "rules":
        return RulesCritic()

    return LLMCritic(options, api_key=api_key, fallback=RulesCritic())
