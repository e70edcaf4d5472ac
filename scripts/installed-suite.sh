#!/usr/bin/env bash
# The conformance suite exactly as a platform team installs it on a runner without a checkout:
#   scripts/installed-suite.sh BUILD.json TIER OUTDIR [IMAGE [ARGS...]]
# builds the wheel, installs it with the commands README.md shows (its block marked
# `<!-- installed-suite.sh: install -->`, run as they are, in a folder holding only the wheel
# and requirements.lock: what the README tells a user to run is what runs here), and runs
# `trainbase-conformance` from an empty directory outside the repository on IMAGE (default, or
# "-": the first image the build report lists as usable), ARGS passed on (e.g. --expect FILE).
# JUnit and Markdown land in OUTDIR; the exit status is the command's.
#   scripts/installed-suite.sh --install-commands
# prints the install commands it would run (TRAINBASE_INSTALL_DOC: another document), or fails
# naming what is missing.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DOC="${TRAINBASE_INSTALL_DOC:-$REPO/README.md}"
MARKER='<!-- installed-suite.sh: install -->'

# The body of the fenced block right after the marker line (blank lines between them allowed).
install_commands() {
  local body
  body="$(awk -v marker="$MARKER" '
    state == 0 && index($0, marker) == 1 { state = 1; next }
    state == 1 && /^[[:space:]]*$/ { next }
    state == 1 && /^```/ { state = 2; next }
    state == 1 { exit 3 }
    state == 2 && /^```/ { state = 3; exit }
    state == 2 { print }
    END { if (state == 2) exit 4 }
  ' "$DOC")" || { echo "installed-suite: $DOC: the line after '$MARKER' must open a fenced code block, closed" >&2; return 1; }
  if [ -z "${body//[[:space:]]/}" ]; then
    echo "installed-suite: $DOC: no install commands: a fenced block after a line '$MARKER'" >&2
    return 1
  fi
  printf '%s\n' "$body"
}

if [ "${1:-}" = --install-commands ]; then
  install_commands
  exit
fi
report="${1:?usage: installed-suite.sh BUILD.json TIER OUTDIR [IMAGE] | --install-commands}" tier="${2:?tier}" out="${3:?outdir}"
image="${4:--}"
shift $(($# < 4 ? $# : 4))
commands="$(install_commands)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
if [ "$image" = - ]; then
  image="$("$REPO/.venv/bin/python" -c 'import sys; from trainbase_common.states import usable_images; print(usable_images(sys.argv[1])[0])' "$report")"
fi
work="$(mktemp -d /tmp/trainbase-suite.XXXXXX)"
trap 'rm -rf "$work"' EXIT
bash "$REPO/scripts/conformance-wheel.sh" build "$work/dist" >/dev/null
mkdir "$work/install"
cp "$REPO/packaging/conformance/requirements.lock" "$work"/dist/trainbase_conformance-*.whl "$work/install/"
echo "installing as $(basename "$DOC") shows it:"
sed 's/^/  | /' <<<"$commands"
(cd "$work/install" && PIP_QUIET=1 PIP_DISABLE_PIP_VERSION_CHECK=1 bash -euo pipefail -c "$commands")
suite=("$work"/install/*/bin/trainbase-conformance)
[ -x "${suite[0]}" ] || { echo "installed-suite: the install commands made no <venv>/bin/trainbase-conformance" >&2; exit 1; }
pip="$(dirname "${suite[0]}")/pip"
mkdir "$work/run"
cd "$work/run"   # nothing of the checkout on sys.path, no pyproject.toml above
echo "installed: $("$pip" list 2>/dev/null | grep -i '^trainbase-conformance')  image: $image  tier: $tier"
"${suite[0]}" "$image" --tier "$tier" \
  --junitxml "$out/junit.xml" --markdown "$out/conformance.md" -q "$@"
