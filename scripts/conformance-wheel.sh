#!/usr/bin/env bash
# The conformance suite's wheel (packaging/conformance):
#   scripts/conformance-wheel.sh build DIR     build trainbase_conformance-*.whl into DIR
#   scripts/conformance-wheel.sh lock          refresh packaging/conformance/requirements.lock:
#       every dependency of the wheel, exact versions and sha256 of every file PyPI has for them
#       (so --require-hashes works on any platform), at the versions the repository itself pins
#       (requirements*.txt), so the installed suite runs with what the repository tested.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
PIP_TOOLS="pip-tools==7.6.2"
case "${1:-}" in
  build)
    out="${2:?usage: conformance-wheel.sh build DIR}"
    mkdir -p "$out"
    # hatchling (pinned in the pyproject's build-system) is fetched into pip's isolated build env
    "$PY" -m pip wheel --quiet --no-deps -w "$out" "$REPO/packaging/conformance"
    ls "$out"/trainbase_conformance-*.whl
    ;;
  lock)
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    "$PY" -m venv "$work/venv"
    "$work/venv/bin/pip" install --quiet "$PIP_TOOLS"
    grep -hE '^[A-Za-z0-9_.-]+(\[[^]]*\])?==' "$REPO/requirements.txt" "$REPO/requirements-dev.txt" \
      | sed -E 's/\[[^]]*\]//; s/[[:space:]]*#.*$//' >"$work/constraints.txt"
    cd "$REPO/packaging/conformance"
    CUSTOM_COMPILE_COMMAND="scripts/conformance-wheel.sh lock" "$work/venv/bin/pip-compile" --quiet \
      --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links \
      -c "$work/constraints.txt" -o requirements.lock pyproject.toml
    sed -i "s|--constraint=$work/constraints.txt|--constraint=<the repository's pins>|" requirements.lock
    ;;
  *) echo "usage: conformance-wheel.sh build DIR | lock" >&2; exit 2 ;;
esac
