#!/usr/bin/env bash
# An image trainbase did not build, through the installed suite:
#   scripts/foreign-image.sh [TIERS] [OUTDIR]
# builds tests/foreign/azureml-openmpi4.1.0-cuda11.8-cudnn8-ubuntu22.04 (Azure ML's published
# recipe, rebuilt from what this machine can reach: see its Dockerfile) FROM the local Debian
# base, then runs `trainbase-conformance IMAGE --expect expectations.yaml` from a fresh venv.
# Its result is a finding about that image, not about trainbase: failures are expected and
# printed (docs/conformance.md has the table); the script fails only if the build fails or the
# suite cannot run (exit status >= 2).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tiers="${1:-static,cpu}" out="${2:-$REPO/reports/foreign}"
recipe="$REPO/tests/foreign/azureml-openmpi4.1.0-cuda11.8-cudnn8-ubuntu22.04"
image="trainbase-foreign/azureml-openmpi4.1.0-cuda11.8-cudnn8-ubuntu22.04:rebuilt"
base="trainbase-bootstrap/debian:12.15-slim"   # what scripts/setup.sh / the build bootstrap here
network=()
[ -n "${TRAINBASE_BUILD_NETWORK:-}" ] && network=(--network "$TRAINBASE_BUILD_NETWORK")
ctx="$(mktemp -d /tmp/trainbase-foreign.XXXXXX)"
trap 'rm -rf "$ctx"' EXIT
cp "$recipe/Dockerfile" "$recipe/wheels.txt" "$ctx/"
# the wheels the recipe installs, fetched here (PyPI's CA is the host's) and checked by hash
"$REPO/.venv/bin/python" -m pip download --quiet --no-deps --require-hashes -r "$recipe/wheels.txt" -d "$ctx/wheels"
echo "==> build $image FROM $base"
start=$SECONDS
DOCKER_BUILDKIT=0 docker build -q "${network[@]}" --build-arg "BASE=$base" -t "$image" "$ctx" >"$ctx/build.log" 2>&1 \
  || { tail -n 40 "$ctx/build.log" >&2; echo "foreign-image: the build of $image failed" >&2; exit 2; }
echo "    built in $((SECONDS - start)) s"
rc=0
bash "$REPO/scripts/installed-suite.sh" - "$tiers" "$out" "$image" --expect "$recipe/expectations.yaml" --tb=line || rc=$?
[ "$rc" -le 1 ] || { echo "foreign-image: the suite could not run (exit $rc)" >&2; exit "$rc"; }
# the verdict must be the recorded one (outcomes.json): each recorded failure fails with a message
# matching its pattern, every other check passes or skips exactly as recorded (a check drifting
# from passed to skipped is named too), no check is new or gone
cd "$REPO" && "$REPO/.venv/bin/python" -m tests.conformance.verdict "$out/junit.xml" --foreign "$recipe/outcomes.json" \
  --verdict-only
