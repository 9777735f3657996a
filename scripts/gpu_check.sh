#!/usr/bin/env bash
# The GPU check for a lent device (one GPU, PyTorch + transformers, no verl/vLLM/Ray, no network, a few minutes):
# mart's local backend on CUDA with a ~300M-parameter model, device memory peaks under CUDA_VISIBLE_DEVICES (NVML,
# or torch.cuda.mem_get_info without nvidia-ml-py), and the memory-margin rule against the real device. Prints ONE
# JSON verdict on stdout (progress on stderr); exit 0 on "pass" or "dry-run". docs/backends.md, "GPU check".
#
#   scripts/gpu_check.sh --dry-run                  # the plan, on any machine (no GPU, no mart dependencies)
#   scripts/gpu_check.sh [--steps 3] [--layers 24] [--width 1024] [--margin 0.1] [--out DIR]
#   scripts/gpu_check.sh --smoke-cpu                # the whole flow on the CPU, tiny model: no GPU figures
#   scripts/gpu_check.sh --wheelhouse [PYVER ...]   # on a machine with PyPI: wheels the device may lack -> .whl/
#
# mart is not built or installed: the package is assembled from this tree with symlinks (pyproject's package-dir
# mapping), so nothing needs setuptools or a network. What mart needs beyond torch (pydantic, psutil) is taken
# from ./.whl/ when the device lacks it (carry .whl with the tree: it is git-ignored).
set -u
cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
PY=${PYTHON:-python3}
NEEDS="pydantic psutil"          # import names = package names
OPTIONAL="pynvml:nvidia-ml-py"    # module:package; without it the device memory comes from torch

if [ "${1:-}" = "--wheelhouse" ]; then
  shift
  versions=${*:-"3.10 3.11 3.12 3.13"}
  for v in $versions; do
    # shellcheck disable=SC2086  # the package list is split on purpose
    "$PY" -m pip download -q --only-binary=:all: --implementation cp --python-version "$v" \
      --platform manylinux2014_x86_64 -d .whl $NEEDS "${OPTIONAL#*:}" >&2 || echo "wheels for python $v: failed" >&2
  done
  du -sh .whl >&2
  exit 0
fi

SITE=$(mktemp -d "${TMPDIR:-/tmp}/mart-gpu-site.XXXX")
mkdir -p "$SITE/mart"
cp mart/__init__.py "$SITE/mart/__init__.py"
for layer in graph tools nodes trial_runner state; do
  ln -s "$REPO/$layer" "$SITE/mart/$layer"
done
missing=()
for mod in $NEEDS $OPTIONAL; do
  "$PY" -c "import ${mod%%:*}" 2>/dev/null || missing+=("${mod#*:}")
done
if [ ${#missing[@]} -gt 0 ] && [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --find-links .whl --target "$SITE" "${missing[@]}" >&2 \
    || echo "[gpu_check] installing ${missing[*]} from .whl failed" >&2
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" scripts/gpu_check.py "$@"
status=$?
rm -rf "$SITE"
exit $status
