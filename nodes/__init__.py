"""Graph nodes: profiler, proposer, critic, human review, health monitor, stage control.

Agents (the proposer's and critic's strategies: rules, llm) live in ``mart.nodes.agents``.
"""
