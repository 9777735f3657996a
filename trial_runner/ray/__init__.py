"""Trials as Ray jobs on an existing cluster (``--ray-address http://HEAD:8265``); see ``runner``."""

from mart.trial_runner.ray.runner import RayJobRunner

__all__ = ["RayJobRunner"]
