"""The package's import name is ``mart`` alone: no flat import of a layer folder may sneak back.

Under pytest the repository root is on ``sys.path``, so a stale ``from state.models import X`` would still
import here and break only for users; this test reads the sources instead of importing them.
"""

from __future__ import annotations

import ast

import pytest

from tests.support.paths import REPO

LAYERS = {"graph", "nodes", "tools", "state", "trial_runner"}
SOURCES = sorted(
    p for folder in ("graph", "nodes", "tools", "state", "trial_runner", "tests", "bench", "examples", "mart")
    for p in (REPO / folder).rglob("*.py")
)


def flat_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [n for n in names if n.split(".")[0] in LAYERS]
    return found


def test_the_check_sees_a_flat_import():
    assert flat_imports("from state.models import X\nimport tools.launch\nfrom mart.state import models\n") == [
        "state.models", "tools.launch"]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_flat_imports(path):
    assert flat_imports(path.read_text()) == [], f"{path.relative_to(REPO)}: import through mart.* instead"
