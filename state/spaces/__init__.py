"""Search-space catalogues, one module per backend (``local``, ``verl``; the simulator uses ``verl``)."""
