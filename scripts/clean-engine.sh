#!/usr/bin/env bash
# A second, empty dockerd for clean-room tests, next to the main engine.
#
#   scripts/clean-engine.sh [start] [DIR]         start it (DIR: /tmp/trainbase-clean)
#   scripts/clean-engine.sh stop [--purge] [DIR]  stop it, remove its bridge
#                                                 (--purge: also its data root)
#
# `start` prints one line on stdout, so this works:
#   eval "$(scripts/clean-engine.sh)"     # sets DOCKER_HOST=unix://DIR/docker.sock
#
# The engine gets a bridge of its own ($TRAINBASE_CLEAN_BRIDGE, default br-fresh,
# 192.168.213.1/24: the bridge's own address, never a traffic target) and runs with
# --iptables=false, so containers on its default network have no way out: builds and
# runs against it need `--network host` (e.g. `docker build --network host ...`).
# Never start a second engine with `--bridge=none`: that makes it delete the main
# engine's docker0, and every `docker run` on the main engine then fails.
set -euo pipefail

BRIDGE="${TRAINBASE_CLEAN_BRIDGE:-br-fresh}"
BRIDGE_ADDR="${TRAINBASE_CLEAN_BRIDGE_ADDR:-192.168.213.1/24}"
# Address pool for the networks tests create on this engine (multi-node conformance). The main
# engine's iptables set FORWARD to DROP and br_netfilter sends bridged frames through it, so
# without a rule container-to-container traffic on this engine's bridges is dropped; the rule
# accepts exactly this pool (our own test containers), nothing else.
POOL="${TRAINBASE_CLEAN_POOL:-192.168.216.0/21}"
WAIT_SECONDS="${TRAINBASE_CLEAN_WAIT:-60}"

say() { echo "clean-engine: $*" >&2; }
die() { echo "clean-engine: error: $*" >&2; exit 1; }

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }

cmd=start
case "${1:-}" in
  start) shift ;;
  stop) cmd=stop; shift ;;
  -h|--help) usage 0 ;;
esac
purge=0
args=()
for a in "$@"; do
  case "$a" in
    --purge) purge=1 ;;
    -*) die "unknown option $a" ;;
    *) args+=("$a") ;;
  esac
done
[ "${#args[@]}" -le 1 ] || usage
[ "$purge" = 0 ] || [ "$cmd" = stop ] || die "--purge only goes with stop"

DIR="${args[0]:-/tmp/trainbase-clean}"
case "$DIR" in /*) ;; *) DIR="$PWD/$DIR" ;; esac
DIR="${DIR%/}"
[ -n "$DIR" ] && [ "$DIR" != / ] || die "refusing to use / as the engine directory"
DATA="$DIR/data"
EXEC="$DIR/exec"
PIDFILE="$DIR/dockerd.pid"
SOCK="$DIR/docker.sock"
LOG="$DIR/dockerd.log"
HOST="unix://$SOCK"

[ "$(id -u)" = 0 ] || die "needs root (dockerd, ip link)"
# A Unix socket path is limited to 107 bytes.
[ "${#SOCK}" -le 100 ] || die "socket path too long: $SOCK (use a shorter DIR)"

PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

# A client for talking to the engine: any docker client answers `info`.
client() {
  local c
  for c in /usr/bin/docker docker; do
    if command -v "$c" >/dev/null 2>&1; then echo "$c"; return; fi
  done
  die "no docker client found (apt-get install docker.io)"
}

answers() { DOCKER_HOST="$HOST" "$(client)" info --format '{{.ServerVersion}}' >/dev/null 2>&1; }

running_pid() {
  local pid
  [ -f "$PIDFILE" ] || return 1
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && grep -q '^dockerd' "/proc/$pid/comm" && echo "$pid"
}

# Unmount anything left mounted under DIR (overlay layers, netns), deepest first.
umount_under() {
  local mp
  awk -v d="$DIR" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts \
    | awk '{ print length, $0 }' | sort -rn | cut -d' ' -f2- \
    | while read -r mp; do umount -l "$mp" 2>/dev/null || true; done
}

start() {
  if pid="$(running_pid)" && answers; then
    say "already running (pid $pid, data root $DATA)"
    echo "export DOCKER_HOST=$HOST"
    return
  fi
  command -v dockerd >/dev/null || die "dockerd not found (apt-get install docker.io)"
  mkdir -p "$DATA" "$EXEC"

  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    say "creating bridge $BRIDGE ($BRIDGE_ADDR)"
    ip link add "$BRIDGE" type bridge
    ip addr add "$BRIDGE_ADDR" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up

  if command -v iptables >/dev/null && iptables -S FORWARD >/dev/null 2>&1 \
      && ! iptables -C FORWARD -s "$POOL" -d "$POOL" -j ACCEPT 2>/dev/null; then
    iptables -I FORWARD 1 -s "$POOL" -d "$POOL" -j ACCEPT
    say "iptables: FORWARD accepts $POOL <-> $POOL (this engine's test networks)"
  fi
  say "starting dockerd (data root $DATA, log $LOG)"
  # setsid: the daemon outlives this shell. Its own containerd namespace keeps it
  # apart from the main engine even if both end up on one system containerd.
  setsid dockerd \
    --data-root "$DATA" \
    --exec-root "$EXEC" \
    --pidfile "$PIDFILE" \
    -H "$HOST" \
    -b "$BRIDGE" \
    --iptables=false \
    --default-address-pool "base=$POOL,size=24" \
    --containerd-namespace trainbase-clean \
    --containerd-plugins-namespace trainbase-clean-plugins \
    </dev/null >>"$LOG" 2>&1 &
  local dpid=$! i
  for ((i = 0; i < WAIT_SECONDS * 2; i++)); do
    if answers; then
      say "engine answers after $((i / 2)) s (pid $(running_pid || echo "$dpid")); builds need --network host"
      echo "export DOCKER_HOST=$HOST"
      return
    fi
    if ! kill -0 "$dpid" 2>/dev/null; then
      tail -n 20 "$LOG" >&2 || true
      die "dockerd exited before answering (log above: $LOG)"
    fi
    sleep 0.5
  done
  tail -n 20 "$LOG" >&2 || true
  die "dockerd (pid $dpid) did not answer within $WAIT_SECONDS s (log above: $LOG)"
}

stop() {
  local pid i
  if pid="$(running_pid)"; then
    say "stopping dockerd (pid $pid)"
    kill -TERM "$pid"
    for ((i = 0; i < 60; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      say "dockerd did not stop in 30 s; killing it"
      kill -KILL "$pid" || true
    fi
  else
    say "no dockerd running from $DIR"
  fi
  rm -f "$PIDFILE" "$SOCK"
  if command -v iptables >/dev/null && iptables -C FORWARD -s "$POOL" -d "$POOL" -j ACCEPT 2>/dev/null; then
    iptables -D FORWARD -s "$POOL" -d "$POOL" -j ACCEPT
  fi
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    say "removing bridge $BRIDGE"
    ip link del "$BRIDGE"
  fi
  umount_under
  if [ "$purge" = 1 ]; then
    if awk -v d="$DIR" '$2 == d || index($2, d "/") == 1 { f = 1 } END { exit !f }' /proc/mounts; then
      die "not purging $DIR: something is still mounted under it"
    fi
    say "purging $DIR"
    rm -rf "$DATA" "$EXEC" "$LOG"
    rmdir "$DIR" 2>/dev/null || true
  fi
}

"$cmd"
