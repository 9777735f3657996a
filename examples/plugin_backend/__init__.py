"""A tiny user backend for mart: a toy training job launched as a subprocess (see README.md).

Load it without changing mart: ``--backend examples.plugin_backend.backend:make_backend``.
"""
