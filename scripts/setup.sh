#!/usr/bin/env bash
# One-command set-up of a fresh machine for trainbase (root, Debian/Ubuntu).
# Idempotent: run it again at any time.
#
#   scripts/setup.sh
#
# 1. installs the host packages trainbase needs (git, curl, xz-utils, debootstrap,
#    python3-venv when the host python cannot make a venv, docker.io only when no
#    container engine answers and no dockerd is installed);
# 2. creates .venv in the repository with the host python3 (>= 3.11) and installs
#    requirements-dev.txt into it;
# 3. makes sure a container engine answers (`python -m trainbase.engine ensure`
#    starts dockerd in the background when needed).
#
# Environment: PYTHON (default python3), TRAINBASE_REQUIREMENTS (default
# requirements-dev.txt in the repository), DOCKER_HOST (honoured; a custom one is
# never replaced by a default engine).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
REQUIREMENTS="${TRAINBASE_REQUIREMENTS:-$REPO/requirements-dev.txt}"
VENV="$REPO/.venv"

step() { echo "==> $*"; }
info() { echo "    $*"; }
die() { echo "setup: error: $*" >&2; exit 1; }

PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
export DEBIAN_FRONTEND=noninteractive
export NEEDRESTART_SUSPEND=1   # never let needrestart restart services (dockerd) from here

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 "$@"
  else die "needs root to run: $*"
  fi
}

engine_answers() {
  local c
  for c in /usr/bin/docker docker; do
    command -v "$c" >/dev/null 2>&1 || continue
    "$c" info --format '{{.ServerVersion}}' >/dev/null 2>&1 && return 0
  done
  return 1
}

# --- 1. host packages -------------------------------------------------------
step "host packages"
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
  die "this set-up supports Debian/Ubuntu hosts (apt-get); install git, curl, xz-utils, debootstrap, python3 (>= 3.11) with venv and a docker engine yourself"
fi

want=(ca-certificates git curl xz-utils debootstrap docker-registry)   # docker-registry: the loopback registry of the publish tests
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  want+=(python3 python3-venv)
elif ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  want+=(python3-venv)   # Debian's python3 cannot make a venv without it
fi
if engine_answers; then
  info "a container engine answers${DOCKER_HOST:+ at $DOCKER_HOST}: docker.io not needed"
elif ! command -v dockerd >/dev/null 2>&1; then
  want+=(docker.io)
fi

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  info "installing: ${missing[*]}"
  apt_log="$(mktemp)"
  if ! { as_root apt-get update -qq && as_root apt-get install -y -qq "${missing[@]}"; } >"$apt_log" 2>&1; then
    tail -n 30 "$apt_log" >&2
    rm -f "$apt_log"
    die "apt-get install ${missing[*]} failed (output above)"
  fi
  rm -f "$apt_log"
else
  info "all present: ${want[*]}"
fi

# --- 2. Python virtual environment --------------------------------------------
step "python venv ($VENV)"
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$PYTHON is $("$PYTHON" -c 'import platform; print(platform.python_version())'); trainbase needs >= 3.11 (set PYTHON=...)"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  info "exists ($("$VENV/bin/python" -c 'import platform; print(platform.python_version())'))"
else
  [ ! -e "$VENV" ] || { info "replacing a broken or too-old venv"; rm -rf "$VENV"; }
  "$PYTHON" -m venv "$VENV"
  info "created with $("$VENV/bin/python" -c 'import platform; print(platform.python_version())')"
fi
[ -f "$REQUIREMENTS" ] || die "$REQUIREMENTS not found"
info "pip install -r $(basename "$REQUIREMENTS")"
"$VENV/bin/python" -m pip install -q -r "$REQUIREMENTS"

# --- 3. container engine ----------------------------------------------------
step "container engine"
cd "$REPO"
"$VENV/bin/python" -m trainbase.engine ensure
info "docker client for builds: $("$VENV/bin/python" -m trainbase.engine cli)"

step "done: activate with 'source .venv/bin/activate'"
