"""The embedded default workload: real GRPO on a tiny transformer on the CPU (or CUDA when present).

Modules (nanoGPT-like, one concern each): ``config`` (the typed flat config and its validation),
``task`` (digit sorting, verifier), ``model`` (the policy), ``rollout`` (generation, batch layout),
``base_model`` (cached warm-up), ``grpo`` (one step = verl's phases), ``memory`` (peak memory, the
emulated capacity), ``worker`` (the trial process), ``runner`` and ``backend`` (mart's plugin).
Importing this package imports nothing heavy; torch is imported by the trial process only.
"""
