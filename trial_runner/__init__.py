"""Trial runners: launch, watch and stop training jobs (local CPU GRPO, verl, Ray jobs, simulator).

Backends are registered by name in ``mart.trial_runner.registry``; ``package.module:factory`` loads a plugin.
"""
