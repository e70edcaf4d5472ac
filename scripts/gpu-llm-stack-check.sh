#!/usr/bin/env bash
# The LLM stack's GPU checks on a bare GPU host (no Docker, no network): what the gpu tier runs
# in a `te` image (trainbase_conformance/checks/test_llm_stack.py), run against the host's own
# torch with the release's pinned wheels installed beside it (--target, nothing of the host's
# Python changed) and TransformerEngine's PyTorch extension compiled from the pinned sdist
# against that torch, as the image's block does.
#   scripts/gpu-llm-stack-check.sh WHEEL_DIR [OUT]
# WHEEL_DIR holds the wheels of matrix.yaml's te release (and their requirements the host lacks)
# and transformer_engine_torch-<version>.tar.gz. Writes build.log, cuobjdump.txt, result.json.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
WHEELS="$1"
OUT="${2:-${OUT:-gpu-llm-stack-check}}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
SITE=/tmp/tb-llm-site
rm -rf "$SITE" && mkdir -p "$SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl \
  > "$OUT/install.log" 2>&1 || { echo "wheel install FAILED: $(tail -c 800 "$OUT/install.log")"; exit 1; }
# a site directory, not a bare path: the CuTe DSL's `cutlass` module is found through its .pth file
mkdir -p "$SITE.boot" && echo "import site; site.addsitedir('$SITE')" > "$SITE.boot/sitecustomize.py"
export PYTHONPATH="$SITE.boot:$SITE${PYTHONPATH:+:$PYTHONPATH}"
sdist="$(ls "$WHEELS"/transformer_engine_torch-*.tar.gz)"
src=/tmp/tb-te-src && rm -rf "$src" && mkdir -p "$src" && tar -xzf "$sdist" -C "$src" --strip-components=1
# as the image's block: never the guessed GitHub wheel; headers from the NVIDIA wheels. A host
# whose wheels lack nvidia-cuda-crt (the image's compiler set has it) takes crt/ from its toolkit.
export CPATH="${CPATH:+$CPATH:}${CUDA_HOME:-/usr/local/cuda}/include"
start=$(date +%s)
if NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_BUILD_USE_NVIDIA_WHEELS=1 MAX_JOBS="$(nproc)" \
   "$PY" -m pip install --no-deps --no-build-isolation --no-cache-dir --target "$SITE/ext" "$src" > "$OUT/build.log" 2>&1; then
  echo "transformer_engine_torch built in $(( $(date +%s) - start )) s"
  ls -la "$SITE"/ext >> "$OUT/build.log"
  cp -a "$SITE"/ext/. "$SITE"/
else
  echo "extension build FAILED after $(( $(date +%s) - start )) s: $(tail -c 1500 "$OUT/build.log")"
  exit 1
fi
lib="$(ls "$SITE"/transformer_engine/wheel_lib/libtransformer_engine.so)"
{ cuobjdump --list-elf "$lib" | sed -E 's/.*\.(sm_[0-9]+[a-z]?)\..*/\1/' | sort | uniq -c
  echo "--- ptx"; cuobjdump --list-ptx "$lib" | sed -E 's/.*\.(sm_[0-9]+[a-z]?)\..*/\1/' | sort | uniq -c
  echo "--- ldd of the extension"; ldd "$SITE"/transformer_engine_torch*.so "$SITE"/transformer_engine/wheel_lib/libtransformer_engine.so; } > "$OUT/cuobjdump.txt" 2>&1
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
timeout 900 "$PY" examples/llm_stack_gpu.py > "$OUT/result.log" 2>&1
rc=$?
tail -n 1 "$OUT/result.log" > "$OUT/result.json"
grep -E '^(OK|FAIL) ' "$OUT/result.log" | cut -c1-600
echo "result: exit $rc"
exit $rc
