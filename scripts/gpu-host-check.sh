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
# The launch contract on the real GPU (when this Python has PyTorch): Azure ML's MPI mode as Open
# MPI and Azure set it for one process, mapped by trainbase_launch to what torch.distributed
# reads, then an NCCL all-reduce through torch, value-checked.
if "$PY" -c 'import torch' 2>/dev/null; then
  if env OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1 OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=1 \
      AZ_BATCH_MASTER_NODE=127.0.0.1:29511 PYTHONPATH=imagefs/opt/trainbase/lib \
      timeout 300 "$PY" imagefs/opt/trainbase/lib/trainbase_launch.py "$PY" -c '
import json, os, torch, torch.distributed as dist
dist.init_process_group("nccl")
t = torch.full((1 << 20,), float(dist.get_rank() + 1), device="cuda:" + os.environ["LOCAL_RANK"])
dist.all_reduce(t)
ok = bool((t == dist.get_world_size() * (dist.get_world_size() + 1) / 2).all())
print(json.dumps({"probe": "launch", "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")},
                  "backend": dist.get_backend(), "nccl": ".".join(map(str, torch.cuda.nccl.version())), "ok": ok}))
dist.destroy_process_group()
raise SystemExit(0 if ok else 1)' > "$OUT/probe-launch.json" 2>&1; then
    echo "probe launch: ok $(tail -n 1 "$OUT/probe-launch.json")"
  else
    rc=1; echo "probe launch: FAILED $(tail -c 600 "$OUT/probe-launch.json")"
  fi
fi
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
