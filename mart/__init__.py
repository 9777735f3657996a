"""mart: multi-agent, human-reviewed hyperparameter tuning for LLM RL post-training (GRPO on verl).

The installed package maps the repository's top-level folders (see ``pyproject.toml``'s ``package-dir``):
``mart.graph`` (session graph, CLI, reviewers) → ``mart.tools`` (trial tool nodes) → ``mart.nodes``
(decision nodes, agents) → ``mart.trial_runner`` (backends) → ``mart.state`` (schemas, storage). Each layer
imports only the layers after it in that list.
"""

__version__ = "0.1.0"
