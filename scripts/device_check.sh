#!/usr/bin/env bash
# Proves the cuda-hopper bundle on a machine with an NVIDIA GPU (x86-64, Python 3.10+; it needs
# neither TVM nor a network there).
#
# On a development machine, first:
#   dynshape-perception bundle --target cuda-hopper --out build/bundle-cuda-hopper
# Copy the checkout (or just this script and the bundle) to the GPU machine, then:
#   bash scripts/device_check.sh [BUNDLE]
# It installs the runtime-only bundle outside the checkout, runs every model and count on the GPU
# with the embedded sm_90 cubins (a CUDA compile at load is refused, so none can happen), compares
# with the NumPy reference outputs saved in the bundle, and writes to $OUT (build/device-check):
#   device_check.json  the runner's report (per model and count: max abs diff, run and load times)
#   device_info.txt    GPU, driver, Python, and where libcudart.so.13 came from
# Exit status: the runner's (0 all within 1e-4 x max(1, |ref|), 1 a mismatch, other: it failed).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUNDLE=${1:-$REPO/build/bundle-cuda-hopper}
INSTALL=${DYNSHAPE_BUNDLE_INSTALL:-/tmp/dynshape-bundle}
OUT=${OUT:-$REPO/build/device-check}
PYTHON=${PYTHON:-python3}

if [ ! -f "$BUNDLE/run_bundle.py" ]; then
  echo "device_check: no bundle at $BUNDLE; build it first (see the header of $0)" >&2
  exit 2
fi
mkdir -p "$OUT"
rm -rf "$INSTALL"
cp -a "$BUNDLE" "$INSTALL"

{
  echo "bundle: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["target"], d["tvm_version"], d["total_bytes"], "bytes")' "$INSTALL/bundle.json")"
  echo "python: $($PYTHON -c 'import sys, platform; print(platform.python_version(), sys.executable)')"
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>&1 || true
} | tee "$OUT/device_info.txt"

started=$SECONDS
status=0
PYTHONUNBUFFERED=1 "$PYTHON" "$INSTALL/run_bundle.py" --json "$OUT/device_check.json" || status=$?
echo "runner: exit $status in $((SECONDS - started)) s" | tee -a "$OUT/device_info.txt"
if [ -f "$OUT/device_check.json" ]; then
  "$PYTHON" - "$OUT/device_check.json" <<'EOF' | tee -a "$OUT/device_info.txt"
import json, sys
report = json.load(open(sys.argv[1]))
print(f"device {report.get('device_name')} sm {report.get('compute_version')}, cudart {report['cudart']}")
print(f"TVM import {report['import_s']} s, compiler loaded: {report['compiler_loaded']}")
for name, model in report["models"].items():
    slowest = max((c["run_s"] for c in model["cases"]), default=0.0)
    print(f"{name}: max abs diff {model['max_abs_diff']:.3g}, load {model['load_s']} s, "
          f"slowest call {slowest} s, {'ok' if model['ok'] else 'FAILED'}")
EOF
fi
exit "$status"
