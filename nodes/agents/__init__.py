"""Agent strategies behind the proposer and critic nodes: ``rules`` (offline default) and ``llm``."""
