"""scripts/mutation_check.py stays runnable: every mutant's text occurs exactly once in its file (a refactor that
moves the code makes a mutant stale, and a stale mutant checks nothing), and every test it names exists."""

from __future__ import annotations

import importlib.util
import sys

from tests.support.paths import REPO


def _mutants():
    spec = importlib.util.spec_from_file_location("mutation_check", REPO / "scripts" / "mutation_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mutation_check"] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop("mutation_check", None)
    return mod.MUTANTS


def test_every_mutant_applies_once_and_names_real_tests():
    mutants = _mutants()
    assert len({m.id for m in mutants}) == len(mutants), "two mutants share an id"
    stale = [f"{m.id} ({m.path}: {(REPO / m.path).read_text().count(m.old)} matches)" for m in mutants
             if (REPO / m.path).read_text().count(m.old) != 1]
    assert not stale, f"stale mutants: {stale}"
    missing = sorted({t.split("::")[0] for m in mutants for t in m.tests if not (REPO / t.split("::")[0]).exists()})
    assert not missing, f"mutants name missing tests: {missing}"
    assert all(m.tests for m in mutants), "a mutant without tests checks nothing"
