#!/usr/bin/env bash
# Packaging checks CI runs (issue 10): the wheel's top level holds only mart/ (and its dist-info), and the
# layers point one way (import-linter's contract in pyproject.toml).
# import-linter reads the package from disk; an editable install maps folders through a meta-path finder it
# cannot see, so the check runs on a plain install of the wheel in a scratch folder.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/wheel" . >/dev/null
rm -rf build
whl=$(ls "$tmp"/wheel/mart-*.whl)
tops=$(python3 - "$whl" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
print(" ".join(sorted({n.split("/")[0] for n in names})))
PY
)
for t in $tops; do
  case "$t" in
    mart|mart-*.dist-info) ;;
    *) echo "wheel top level holds '$t' (only mart/ belongs there): $tops"; exit 1 ;;
  esac
done
echo "wheel top level: $tops"

# every file of a package folder is in the wheel: setuptools packages only the folders pyproject.toml lists, so a
# new folder left off that list works from the checkout and is missing for users (tests/test_packaging.py checks
# the list; this checks the wheel itself)
python3 - "$whl" <<'PY'
import subprocess, sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
roots = ("mart", "graph", "tools", "nodes", "trial_runner", "state")
files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *roots], capture_output=True, text=True,
                       check=True).stdout.split()
files = [f for f in files if "__pycache__" not in f and not f.endswith(".pyc")]
missing = [f for f in files if (f if f.startswith("mart/") else "mart/" + f) not in names]
if missing:
    print("files of package folders missing from the wheel (list their folders in [tool.setuptools] packages):",
          *missing, sep="\n  ")
    sys.exit(1)
print(f"wheel holds all {len(files)} files of the package folders")
PY

python3 -m pip install -q --no-deps --no-compile --target "$tmp/site" "$whl"
# run from the scratch folder, so the repository's own folders are not importable
(cd "$tmp" && PYTHONPATH="$tmp/site" lint-imports "$repo/pyproject.toml")
# the type checker over the lower layers (state/ and nodes/), on the installed wheel as import-linter sees it
# (py.typed ships in the wheel; pyproject's [tool.mypy] sets the pydantic plugin)
(cd "$tmp" && PYTHONPATH="$tmp/site" python3 -m mypy --config-file "$repo/pyproject.toml" -p mart.state -p mart.nodes)
