"""Where a Ray cluster is and how to authenticate to it: one place for the runner and the capacity reader."""

from __future__ import annotations

import os
import re
from pathlib import Path


def normalize_address(address: str) -> str:
    """``HOST:8265`` -> ``http://HOST:8265``; http(s) addresses are kept. ``ray://`` is refused."""
    address = address.strip().rstrip("/")
    if address.startswith("ray://"):
        raise ValueError(f"Ray address {address!r}: use the dashboard's http address (http://HEAD:8265), not ray://.")
    if not re.match(r"^https?://", address):
        address = "http://" + address
    return address


def find_token(token: str | None = None) -> str | None:
    """The cluster's auth token: argument, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token (or None)."""
    if token:
        return token.strip()
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    for path in (os.environ.get("RAY_AUTH_TOKEN_PATH"), str(Path.home() / ".ray" / "auth_token")):
        if path and os.path.isfile(path):
            text = Path(path).read_text().strip()
            if text:
                return text
    return None


__all__ = ["find_token", "normalize_address"]
