"""The package's import name is ``mart`` alone: no flat import of a layer folder may sneak back.

Under pytest the repository root is on ``sys.path``, so a stale ``from state.models import X`` would still
import here and break only for users; this test reads the sources instead of importing them.
"""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import warnings
from pathlib import Path

import pytest
from setuptools.config.pyprojecttoml import read_configuration

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


# --- every package folder in the wheel ---------------------------------------------------------------
# setuptools installs only the packages ``[tool.setuptools] packages`` lists (the layer folders are mapped into
# ``mart`` by ``package-dir``, so its discovery cannot find them): a new folder left off that list works in
# every test from the checkout and is absent from the wheel. ``scripts/check_package.sh`` runs the same
# comparison on a built wheel.
ROOTS = ("mart", "graph", "tools", "nodes", "trial_runner", "state")


def packaged_files(packages: list[str], package_dir: dict[str, str], package_data: dict[str, list[str]],
                   files: list[str]) -> set[str]:
    """The repository files (relative paths) a wheel built with this configuration holds: each listed
    package's own ``*.py`` files and its ``package-data`` globs."""

    def folder(pkg: str) -> str:
        parts = pkg.split(".")
        for i in range(len(parts), 0, -1):  # the longest mapped prefix, as setuptools resolves package-dir
            mapped = package_dir.get(".".join(parts[:i]))
            if mapped is not None:
                return "/".join([mapped, *parts[i:]])
        return "/".join(parts)

    out = set()
    for f in files:
        parent, _, name = f.rpartition("/")
        for pkg in packages:
            base = folder(pkg)
            if parent == base and name.endswith(".py"):
                out.add(f)
            elif f.startswith(base + "/") and any(fnmatch.fnmatch(f[len(base) + 1:], g)
                                                   for g in package_data.get(pkg, ())):
                out.add(f)
    return out


def package_folder_files(root: Path = REPO) -> list[str]:
    """Files under the package roots: git's (tracked and new, not ignored), else every file on disk."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *ROOTS], cwd=root,
                             capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = [str(p.relative_to(root)) for r in ROOTS for p in (root / r).rglob("*") if p.is_file()]
    return sorted(f for f in out if "__pycache__" not in f and not f.endswith(".pyc") and (root / f).is_file())


def _setuptools_config() -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # setuptools calls [tool.setuptools] "beta"
        return read_configuration(REPO / "pyproject.toml")["tool"]["setuptools"]


def test_the_wheel_check_sees_a_missing_folder():
    files = ["trial_runner/base.py", "trial_runner/newbackend/__init__.py", "trial_runner/sim/scenarios/a.yaml",
             "trial_runner/sim/model.py"]
    got = packaged_files(["mart.trial_runner", "mart.trial_runner.sim"], {"mart.trial_runner": "trial_runner"},
                         {"mart.trial_runner.sim": ["scenarios/*.yaml"]}, files)
    assert set(files) - got == {"trial_runner/newbackend/__init__.py"}


def test_every_package_folder_is_in_the_wheel():
    cfg = _setuptools_config()
    files = package_folder_files()
    assert "trial_runner/sim/model.py" in files and "nodes/agents/rules.py" in files
    missing = sorted(set(files) - packaged_files(cfg["packages"], cfg["package-dir"], cfg.get("package-data", {}),
                                                 files))
    assert not missing, ("these files would be missing from the wheel; list their folders in [tool.setuptools] "
                         f"packages (data files in package-data) in pyproject.toml: {missing}")
