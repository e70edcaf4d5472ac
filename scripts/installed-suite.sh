#!/usr/bin/env bash
# The conformance suite exactly as a platform team installs it on a runner without a checkout:
#   scripts/installed-suite.sh BUILD.json TIER OUTDIR [IMAGE [ARGS...]]
# builds the wheel, installs it into a fresh venv (hash-locked requirements, then the wheel
# without dependencies), and runs `trainbase-conformance` from an empty directory outside the
# repository on IMAGE (default, or "-": the first image the build report lists as usable), ARGS
# passed on (e.g. --expect FILE). JUnit and Markdown land in OUTDIR; the exit status is the
# command's.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
report="${1:?usage: installed-suite.sh BUILD.json TIER OUTDIR [IMAGE]}" tier="${2:?tier}" out="${3:?outdir}"
image="${4:--}"
shift $(($# < 4 ? $# : 4))
mkdir -p "$out"
out="$(cd "$out" && pwd)"
if [ "$image" = - ]; then
  image="$("$REPO/.venv/bin/python" -c 'import sys; from trainbase_common.states import usable_images; print(usable_images(sys.argv[1])[0])' "$report")"
fi
work="$(mktemp -d /tmp/trainbase-suite.XXXXXX)"
trap 'rm -rf "$work"' EXIT
bash "$REPO/scripts/conformance-wheel.sh" build "$work/dist" >/dev/null
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --require-hashes -r "$REPO/packaging/conformance/requirements.lock"
"$work/venv/bin/pip" install --quiet --no-deps "$work"/dist/trainbase_conformance-*.whl
mkdir "$work/run"
cd "$work/run"   # nothing of the checkout on sys.path, no pyproject.toml above
echo "installed: $("$work/venv/bin/pip" list 2>/dev/null | grep -i '^trainbase-conformance')  image: $image  tier: $tier"
"$work/venv/bin/trainbase-conformance" "$image" --tier "$tier" \
  --junitxml "$out/junit.xml" --markdown "$out/conformance.md" -q "$@"
