"""Graph state, pydantic schemas, search spaces and storage (checkpoints + ledger) of a tuning session."""
