#!/usr/bin/env bash
# One short check on a machine with an NVIDIA GPU (<= 4 min): the NVML probe (CUDA_VISIBLE_DEVICES respected),
# NVML device-wide peaks vs torch's peak on a real CUDA process, a local-workload trial on CUDA with sampled
# GPU memory peaks, and the verl runner's GPU path (stand-in entry point: device-wide peak in the metrics,
# leftover workers ended). Prints figures; claims nothing it did not measure.
#
#   scripts/gpu_check.sh [STEPS]        # from anywhere; mart is installed into $OUT/site (no venv needed)
#
# Missing Python packages are installed from ./.whl/ (a wheelhouse carried with the repo) if present, else
# from the package index if reachable. Exit status: 0 when the CUDA trial completed, 1 otherwise.
set -u
cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
STEPS=${1:-6}
OUT=${OUT:-$(mktemp -d /tmp/mart-gpu-check.XXXX)}
STATUS=0
mkdir -p "$OUT"
# the package installs as mart.* (package-dir mapping): put a copy of this checkout on the path
if ! "$PY" -m pip install -q --no-deps --no-build-isolation --target "$OUT/site" . >"$OUT/pip-mart.log" 2>&1; then
  "$PY" -m pip install -q --no-deps --target "$OUT/site" . >>"$OUT/pip-mart.log" 2>&1 || echo "installing mart failed (see $OUT/pip-mart.log)"
fi
rm -rf build
export PYTHONPATH="$OUT/site:$REPO${PYTHONPATH:+:$PYTHONPATH}"
# an editable install of another checkout (a meta-path finder) would win over PYTHONPATH: say which code runs
"$PY" -c "import mart, os; print('mart imported from', os.path.dirname(mart.__file__))" 2>/dev/null || echo "mart: NOT importable"

say() { printf '\n=== %s\n' "$*"; }

say "machine"
uname -srm
"$PY" --version
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv,noheader
else
  echo "nvidia-smi: not found"
fi

say "python packages"
if "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -c "import torch; print('torch', torch.__version__, '| cuda available:', torch.cuda.is_available(), '| devices:', torch.cuda.device_count(), '|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"
else
  echo "torch: NOT importable with $PY - the local-workload trial cannot run (install torch, or set PYTHON=...)"
fi
missing=()
for mod in pydantic:pydantic psutil:psutil numpy:numpy pynvml:nvidia-ml-py; do
  "$PY" -c "import ${mod%%:*}" 2>/dev/null || missing+=("${mod#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "missing: ${missing[*]}"
  if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --find-links .whl "${missing[@]}" || true
  else
    timeout 60 "$PY" -m pip install -q "${missing[@]}" || echo "pip install failed (offline?)"
  fi
fi
for mod in pydantic psutil numpy pynvml; do
  "$PY" -c "import $mod" 2>/dev/null && echo "$mod: ok" || echo "$mod: MISSING"
done

say "NVML probe (python -m mart.trial_runner.gpu)"
timeout 30 "$PY" -m mart.trial_runner.gpu || echo "probe failed"

say "CUDA_VISIBLE_DEVICES respected by the probe (NVML itself lists every GPU)"
timeout 30 "$PY" - <<'PYEOF' || echo "CUDA_VISIBLE_DEVICES check FAILED"
import os
from mart.trial_runner.gpu import probe
allg = probe(all_devices=True)
print("GPUs on the node:", [(g.index, g.uuid[:12]) for g in allg])
if allg:
    last = allg[-1]
    for value, want in ((str(last.index), [last.index]), (last.uuid[:10], [last.index]), ("", [])):
        os.environ["CUDA_VISIBLE_DEVICES"] = value
        got = [g.index for g in probe()]
        print(f"CUDA_VISIBLE_DEVICES={value!r}: probe sees {got} (expected {want}):", "OK" if got == want else "WRONG")
PYEOF

say "NVML device-wide peak vs torch's peak on a real CUDA process"
timeout 60 "$PY" - <<'PYEOF' || echo "NVML vs torch check FAILED"
import time
from mart.trial_runner.gpu import PeakSampler
try:
    import torch
except ImportError:
    print("torch missing: skipped")
    raise SystemExit(0)
if not torch.cuda.is_available():
    print("no CUDA: skipped")
    raise SystemExit(0)
s = PeakSampler(0.05)
s.sample_once()
s.start()
x = torch.empty(int(2 * 1024**3), dtype=torch.uint8, device="cuda")  # 2 GiB held by torch
time.sleep(0.5)
torch_peak = torch.cuda.max_memory_allocated() / 1024**3
s.stop()
print(f"torch max_memory_allocated: {torch_peak:.2f} GiB")
print("NVML before:", {k: round(v, 2) for k, v in (s.before_gb or {}).items()},
      "| NVML peak:", {k: round(v, 2) for k, v in s.peaks_gb.items()})
growth = max(s.peaks_gb[k] - (s.before_gb or {}).get(k, 0.0) for k in s.peaks_gb)
print(f"device-wide growth {growth:.2f} GiB vs torch {torch_peak:.2f} GiB (device-wide adds the CUDA context):",
      "OK" if growth >= torch_peak else "UNEXPECTED")
del x
PYEOF

say "local-workload trial on CUDA ($STEPS steps) with NVML peak sampling"
timeout 170 "$PY" - "$OUT" "$STEPS" <<'PYEOF' || STATUS=1
import json, math, subprocess, sys, time
from pathlib import Path
from mart.trial_runner.gpu import PeakSampler, probe, wait_gpu_memory_free

out, steps = Path(sys.argv[1]), int(sys.argv[2])
trial = out / "local-cuda"
trial.mkdir(parents=True, exist_ok=True)
(trial / "config.json").write_text(json.dumps({"local.device": "cuda"}))
cmd = [sys.executable, "-m", "mart.trial_runner.local", "--out", str(trial), "--steps", str(steps),
       "--config", str(trial / "config.json")]
print("run:", " ".join(cmd), flush=True)
before = {g.index: round(g.used_gb, 2) for g in probe()}
t0 = time.time()
with PeakSampler(0.2) as sampler, open(trial / "trial.log", "ab") as log:
    rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=150)
wall = time.time() - t0
print(f"exit code {rc}, wall {wall:.1f} s")
print("GPU used before (GiB):", before, "| sampled peak (GiB):", {k: round(v, 2) for k, v in sampler.peaks_gb.items()},
      f"({sampler.samples} samples)")
recs = []
mpath = trial / "metrics.jsonl"
if mpath.exists():
    for line in mpath.read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            pass
status = (trial / "status.json").read_text() if (trial / "status.json").exists() else "(no status.json)"
print("status:", status)
def fig(rec, *keys):
    for k in keys:
        v = rec["data"].get(k)
        if v is not None:
            return f"{v:.4g}" if isinstance(v, (int, float)) else str(v)
    return "-"
for r in recs:
    print(f"step {r['step']:>3}: throughput {fig(r, 'perf/throughput')} tok/s | step {fig(r, 'timing_s/step', 'perf/time_per_step')} s"
          f" | peak mem {fig(r, 'perf/max_memory_allocated_gb', 'actor/perf/max_memory_allocated_gb')} GB"
          f" | device {fig(r, 'local/device', 'device')}")
print("GPU memory free again (<= 1 GiB used within 30 s):", wait_gpu_memory_free(1.0, 30.0))
ok = rc == 0 and '"completed"' in status
print("LOCAL CUDA TRIAL:", "OK" if ok else "FAILED (see " + str(trial / "trial.log") + ")")
if not ok:
    print("".join((trial / "trial.log").read_text().splitlines(True)[-25:]))
sys.exit(0 if ok else 1)
PYEOF

say "verl runner on this GPU machine (stand-in entry point): supervisor, NVML peaks, GPU-free check, cleanup"
timeout 60 "$PY" - "$OUT" <<'PYEOF' || echo "verl runner check FAILED"
import sys, time
from pathlib import Path
from mart.state.objectives import DEVICE_MEMORY_KEY, peak_memory_gb
from mart.state.trials import TrialSpec
from mart.trial_runner.verl import VerlBackend

out = Path(sys.argv[1])
b = VerlBackend(entrypoint=f"{sys.executable} tests/support/fake_verl/main_ppo.py",
                base_config={"fake.step_s": 0.3, "fake.leak_worker": True}, prevalidate=False)
print("backend memory_capacity_gb (NVML per-GPU total, visible GPUs):", b.memory_capacity_gb())
print("base trainer.n_gpus_per_node:", b.base_config().get("trainer.n_gpus_per_node"))
r = b.make_runner()
h = r.launch(TrialSpec(trial_id="verl-fake", config=b.base_config(), steps=4, trial_dir=str(out / "verl-fake")))
while not (p := r.poll(h)).status.is_finished():
    time.sleep(0.2)
print("status:", p.status.value, p.reason, "last step", p.last_step)
print("gpu_peaks.json:", r.gpu_peaks(h))
recs = r.read_all_metrics(h)
print("device-wide peak in the metrics:", recs[-1].data.get(DEVICE_MEMORY_KEY) if recs else None,
      "| peak the margin rule uses:", peak_memory_gb(recs))
PYEOF

say "verl itself (only when importable here): a 2-step GRPO run is NOT attempted by this script"
"$PY" -c "import verl, sys; print('verl', verl.__version__, 'importable: run a 2-step job by hand with a tiny local model')" 2>/dev/null \
  || echo "verl not importable with $PY: skipped"

say "summary"
echo "outputs in $OUT"
exit $STATUS
