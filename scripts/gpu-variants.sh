#!/usr/bin/env bash
# The gpu tier's own proof that it can fail, on a GPU runner: every broken variant
# (tests/conformance/broken/*) whose expect.json has gpu_must_fail and fits the image under test
# (its MPI kind and framework, read from the image's labels as the self-test does) is built FROM
# that image, the gpu tier runs on it, and each claim must be a failure of that check with its
# message (tests/conformance/verdict.py --gpu). The variant image is removed afterwards.
#
#   scripts/gpu-variants.sh REF SUITE_BIN OUT
#
# SUITE_BIN: the bin/ of a venv with the conformance suite (trainbase-conformance, python).
# Exit 1 when a claim is not proven (a check that passed, or failed for another reason), 0 when
# every fitting variant is rejected as claimed or none fits. Variants that fetch from PyPI
# (`pypi: true`) are not built here: a GPU runner has no CA to stage for them.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REF="${1:?usage: $0 REF SUITE_BIN OUT}"
BIN="${2:?usage: $0 REF SUITE_BIN OUT}"
OUT="${3:?usage: $0 REF SUITE_BIN OUT}"
mkdir -p "$OUT"
labels="$(docker image inspect -f '{{json .Config.Labels}}' "$REF")" || { echo "error: $REF is not in the engine"; exit 2; }
fits() {   # expect.json FILE claims checks of the gpu tier and fits the image's labels
  "$BIN/python" - "$1" "$labels" <<'PY'
import json, sys
e, labels = json.load(open(sys.argv[1])), json.loads(sys.argv[2]) or {}
kind = labels.get("io.trainbase.mpi", "").split("-", 1)[0]
ok = ("gpu_must_fail" in e and not e.get("pypi") and (not e.get("mpi") or e["mpi"] == kind)
      and (not e.get("framework") or f"io.trainbase.framework.{e['framework']}" in labels))
sys.exit(0 if ok else 1)
PY
}
rc=0 n=0
for dir in tests/conformance/broken/*/; do
  variant="$(basename "$dir")"
  fits "$dir/expect.json" || continue
  n=$((n + 1))
  image="trainbase-gpu-variant/$variant:$$"
  echo "==> $variant FROM $REF"
  if ! docker build -q --build-arg BASE="$REF" -t "$image" "$dir" > "$OUT/$variant.build.log" 2>&1; then
    echo "::error::the broken variant $variant did not build FROM $REF (log: $OUT/$variant.build.log)"
    rc=1; continue
  fi
  # the variant is meant to fail its claimed checks: the run's exit says nothing, the verdict does
  "$BIN/trainbase-conformance" "$image" --tier gpu --require-hardware --junitxml "$OUT/$variant.xml" \
    --markdown "$OUT/$variant.md" > "$OUT/$variant.log" 2>&1 || true
  if ! "$BIN/python" -m tests.conformance.verdict "$OUT/$variant.xml" --variant "$variant" --gpu | tee "$OUT/$variant.verdict.txt"; then
    echo "::error::the gpu tier did not reject $variant as its expect.json claims (see $OUT/$variant.verdict.txt)"
    rc=1
  fi
  docker image rm "$image" > /dev/null 2>&1 || true
done
echo "gpu variants: $n fitting $REF, exit $rc"
exit "$rc"
