#!/usr/bin/env bash
# The GPU probes and tb-doctor on a bare GPU host (no Docker, no trainbase image): what the gpu
# tier checks inside an image (trainbase_conformance/probes/gpu_probe.py: device query, a
# JIT-compiled kernel checked element by element, a one-process NCCL all-reduce over every
# local GPU), run against the host's own CUDA runtime and NCCL (found in the Python's NVIDIA
# wheels, else the CUDA toolkit), then `tb-doctor --json --expect gpu` from imagefs/.
# Writes one file per step under OUT (default ./gpu-host-check) and prints a summary.
#   scripts/gpu-host-check.sh [OUT]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${1:-${OUT:-gpu-host-check}}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
find_lib() {   # the newest soname $1 the Python's packages or the toolkit have
  "$PY" - "$1" <<'PYEOF'
import glob, os, site, sys
name = sys.argv[1]
roots = site.getsitepackages() + [site.getusersitepackages(), "/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu"]
hits = sorted({os.path.realpath(p) for r in roots for p in glob.glob(os.path.join(r, "**", name + ".*"), recursive=True)
               if ".so." in p and not p.endswith((".a", ".py"))})
print(hits[-1] if hits else "")
PYEOF
}
CUDART="$(find_lib libcudart.so)"
NCCL="$(find_lib libnccl.so)"
{ echo "cudart: ${CUDART:-none}"; echo "nccl: ${NCCL:-none}"; nvidia-smi -L; } > "$OUT/host.txt" 2>&1
rc=0
for probe in devices kernel nccl; do
  args=("$probe" "$CUDART"); [ "$probe" = nccl ] && args+=("$NCCL")
  if timeout 300 "$PY" trainbase_conformance/probes/gpu_probe.py "${args[@]}" > "$OUT/probe-$probe.json" 2>&1; then
    echo "probe $probe: ok $(head -c 400 "$OUT/probe-$probe.json")"
  else
    rc=1; echo "probe $probe: FAILED $(tail -c 600 "$OUT/probe-$probe.json")"
  fi
done
# the images register the wheels' libraries with ldconfig (tb-register-nvidia-libs); here the
# library path stands in for that
LD_LIBRARY_PATH="$(dirname "${NCCL:-/}"):$(dirname "${CUDART:-/}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  timeout 120 "$PY" imagefs/opt/trainbase/lib/tb-doctor --json --expect gpu > "$OUT/doctor.json" 2> "$OUT/doctor.err"
echo "tb-doctor exit $? (image.* checks fail outside an image; see $OUT/doctor.json)"
"$PY" - "$OUT/doctor.json" <<'PYEOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"doctor output unreadable: {e}"); sys.exit(0)
for c in d.get("checks", []):
    print(f"  {c.get('status', '?'):5} {c.get('id')}: {str(c.get('summary') or c.get('detail') or '')[:150]}")
PYEOF
exit $rc
