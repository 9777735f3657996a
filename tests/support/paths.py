"""Paths the tests share: the repository root and the verl stand-in."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKE_VERL = REPO / "tests" / "support" / "fake_verl" / "main_ppo.py"
