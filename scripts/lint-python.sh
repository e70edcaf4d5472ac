#!/usr/bin/env bash
# Lint the Python with the two checkers pyproject.toml configures; exit non-zero on any finding
# of either (both always run, so one run names everything):
#   ruff check  pyproject.toml [tool.ruff.lint]: the rule set, and each rule it does not apply
#               (or applies elsewhere) with the reason
#   ruff format --check  pyproject.toml [tool.ruff.format]: the tree as the formatter writes it
#               (`ruff format .` fixes it; the one formatting commit is in .git-blame-ignore-revs)
#   mypy        pyproject.toml [tool.mypy]: strict on trainbase/, trainbase_common/ and build.py,
#               checked-untyped-defs on trainbase_conformance/ (its probes run in the images)
# Each prints its whole report only when it finds something; its summary line always.
# .pre-commit-config.yaml runs the same checks.
#
#   scripts/lint-python.sh        (after scripts/setup.sh: both tools come from requirements-dev.txt)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
VENV="$REPO/.venv"

die() { echo "lint-python: error: $*" >&2; exit 2; }
for tool in ruff mypy; do
  want="$(sed -n "s/^$tool==\([0-9][0-9.]*\).*/\1/p" requirements-dev.txt)"
  [ -n "$want" ] || die "requirements-dev.txt pins no $tool"
  [ -x "$VENV/bin/$tool" ] || die "no $tool in .venv: run scripts/setup.sh"
  have="$("$VENV/bin/$tool" --version)"
  case "$have" in
    *" $want"|*" $want "*) ;;
    *) die ".venv has '$have', requirements-dev.txt pins $tool==$want: run scripts/setup.sh" ;;
  esac
done

out="$(mktemp)"
trap 'rm -f "$out"' EXIT
status=0

run() {  # NAME CMD...: the report's last line, the whole report where it failed
  local name="$1" rc=0
  shift
  "$@" >"$out" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    cat "$out"
    status=1
  fi
  # the summary line (ruff puts its fixable count after it), else the report's last line
  local summary
  summary="$(grep -E '^(Found [0-9]+ error|All checks passed|Success: |[0-9]+ files? (already formatted|would be reformatted))' "$out" | tail -n 1 || true)"
  echo "$name: ${summary:-$(tail -n 1 "$out")}"
}

echo "==> ruff check"
run "ruff check" "$VENV/bin/ruff" check --no-cache .
echo "==> ruff format --check"
run "ruff format" "$VENV/bin/ruff" format --check --no-cache .
echo "==> mypy"
run "mypy" "$VENV/bin/mypy"
exit "$status"
