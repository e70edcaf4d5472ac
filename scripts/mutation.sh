#!/usr/bin/env bash
# Mutation testing of the conformance checks against their unit evidence (tests/conformance/mutation.py):
# every check with a unit entry in tests/conformance/failures.yaml made a no-op, and each assert of it
# (and of the helpers of its module it calls) negated and removed; a mutant is killed when the check's
# named evidence fails. No Docker, no GPU; 2 worker processes (one forked pytest per mutant).
#   scripts/mutation.sh            # the CI step: exit 1 when the killed share is under the floor
#                                  # (tests/conformance/mutation-survivors.yaml), a survivor has no
#                                  # reason there, or a mutant's fate differs from the record
#   scripts/mutation.sh --full     # the CI step re-running every check (by default a check whose evidence
#                                  # reads nothing that changed since the record keeps its outcomes)
#   scripts/mutation.sh --record   # after a reviewed change: rewrite the record and docs/conformance.md's block
# The report lands in reports/mutation.json.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || { echo "mutation: run scripts/setup.sh first (no .venv)" >&2; exit 2; }
mkdir -p reports
if [ "${1:-}" = "--record" ]; then
  exec "$PY" -m tests.conformance.mutation --record
fi
exec "$PY" -m tests.conformance.mutation --ci "$@"
