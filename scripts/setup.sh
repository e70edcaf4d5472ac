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
# 3. makes sure a container engine answers: an engine that answers is left alone; for the
#    default socket, dockerd is started in the background (setsid, log in
#    /var/log/trainbase-dockerd.log) and waited for; a custom DOCKER_HOST is never replaced.
#    This is the only place trainbase sets up the host: the Python package never installs
#    packages or starts daemons.
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
# skopeo: writes zstd layers for the pull + start bench (bench/pull_start.py)
want+=(skopeo)
# the speed check's reference (trainbase_conformance/speed.py): the host's own MPI running the same mpi4py probe
want+=(openmpi-bin python3-mpi4py)
# the runtime tier (trainbase_conformance/checks/test_runtime.py): Charliecloud's ch-run and rootless Podman as an unprivileged
# user, and a one-node Slurm (munged, slurmctld, slurmd on loopback, started and stopped by the
# tier itself) whose srun offers --mpi=pmi2 and, with libpmix-dev, --mpi=pmix
want+=(charliecloud podman uidmap slurmctld slurmd slurm-client munge libpmix-dev)
# arm64 cells on an x86_64 host: qemu's user-mode emulator. Installed here, but the handler is
# registered by the build only when an arm64 cell is selected (trainbase_common/emulation.py: from
# qemu's binfmt.d rule, or binfmt-support's database where an older qemu put it there).
# Debian 12's own qemu (7.2) segfaults in `import torch` of PyTorch's aarch64 wheel on recent
# kernels (measured here: kernel 6.18, the PyTorch 2.15 arm64 cell's build died in its import
# check; the base cells built): on bookworm it comes from bookworm-backports (qemu 10), below.
want+=(binfmt-support)
codename="$(. /etc/os-release 2>/dev/null; echo "${VERSION_CODENAME:-}")"
[ "$codename" = bookworm ] || want+=(qemu-user-static)
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
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
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
if [ "$codename" = bookworm ]; then
  qemu_version="$(dpkg-query -W -f='${Version}' qemu-user-static 2>/dev/null || true)"
  if ! dpkg --compare-versions "${qemu_version:-0}" ge 1:8; then
    info "qemu-user-static from bookworm-backports (Debian 12's ${qemu_version:-none} cannot run PyTorch's aarch64 wheel)"
    echo "deb http://deb.debian.org/debian bookworm-backports main" | as_root tee /etc/apt/sources.list.d/trainbase-bookworm-backports.list >/dev/null
    apt_log="$(mktemp)"
    if ! { as_root apt-get update -qq && as_root apt-get install -y -qq -t bookworm-backports qemu-user-static; } >"$apt_log" 2>&1; then
      tail -n 30 "$apt_log" >&2
      die "apt-get install -t bookworm-backports qemu-user-static failed (output above)"
    fi
    rm -f "$apt_log"
    # A handler registered with the F flag keeps the old emulator open: remove it, and the next
    # build that selects an arm64 cell registers qemu 10's. (qemu 10 ships its rules as systemd
    # binfmt.d files, not in binfmt-support's database: `update-binfmts --enable` cannot do it;
    # trainbase_common/emulation.py reads the binfmt.d file.)
    if [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
      echo -1 | as_root tee /proc/sys/fs/binfmt_misc/qemu-aarch64 >/dev/null
      info "removed the old qemu-aarch64 binfmt handler: the next arm64 build registers qemu 10's"
    fi
  fi
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
DOCKERD_LOG=/var/log/trainbase-dockerd.log
DOCKERD_WAIT="${TRAINBASE_DOCKERD_WAIT:-60}"
custom_host=0
case "${DOCKER_HOST:-}" in
  ""|unix:///var/run/docker.sock|unix:///run/docker.sock) ;;
  *) custom_host=1 ;;
esac
if engine_answers; then
  info "an engine answers${DOCKER_HOST:+ at $DOCKER_HOST} ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
elif [ "$custom_host" = 1 ]; then
  die "no engine answers at DOCKER_HOST=$DOCKER_HOST; trainbase only starts the default engine, not one behind a custom DOCKER_HOST (start it, e.g. scripts/clean-engine.sh, or unset DOCKER_HOST)"
else
  [ "$(id -u)" = 0 ] || die "no container engine answers and starting one needs root: run this as root, or start it yourself (sudo systemctl start docker)"
  command -v dockerd >/dev/null 2>&1 || die "no dockerd on this host (docker.io should have been installed above)"
  pid=$(cat /var/run/docker.pid 2>/dev/null || true)
  if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]; then
    info "dockerd (pid $pid) is running but not answering yet: waiting"
  else
    mkdir -p "$(dirname "$DOCKERD_LOG")"
    offset=$(stat -c %s "$DOCKERD_LOG" 2>/dev/null || echo 0)
    info "starting dockerd in the background (log: $DOCKERD_LOG)"
    # setsid: the daemon outlives this shell and its terminal; DOCKER_HOST is not its business
    env -u DOCKER_HOST setsid dockerd </dev/null >>"$DOCKERD_LOG" 2>&1 &
    pid=$!
  fi
  t0=$SECONDS
  until engine_answers; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -c +"$((${offset:-0} + 1))" "$DOCKERD_LOG" 2>/dev/null | tail -n 20 >&2
      die "dockerd exited before answering (last lines of $DOCKERD_LOG above)"
    fi
    if [ $((SECONDS - t0)) -ge "$DOCKERD_WAIT" ]; then
      tail -n 20 "$DOCKERD_LOG" >&2
      die "dockerd (pid $pid) did not answer within ${DOCKERD_WAIT}s (last lines of $DOCKERD_LOG above)"
    fi
    sleep 0.5
  done
  info "dockerd (pid $pid) answers after $((SECONDS - t0)) s"
fi
info "docker client for builds: $("$VENV/bin/python" -c 'from trainbase_common import buildkit; print(buildkit.build_cli())')"

step "done: activate with 'source .venv/bin/activate'"
