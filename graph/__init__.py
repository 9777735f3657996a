"""The tuning graph (builder), the session driver and the ``mart`` command line."""
