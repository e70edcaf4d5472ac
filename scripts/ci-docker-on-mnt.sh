#!/usr/bin/env bash
# Hosted GitHub runners have ~20 GB free on / and a second, mostly empty disk on /mnt (~70 GB).
# A framework cell holds its parent, its image and a `docker save` stream for the waste audit
# (35-40 GB): move Docker's data root and the job's scratch space (TMPDIR) to /mnt when /mnt has
# more room than /, and say what was done. Elsewhere (a self-hosted runner, a laptop) it changes
# nothing unless asked to with --force.
#   scripts/ci-docker-on-mnt.sh [--force] [--dry-run]   (root, or sudo; prints the TMPDIR to use)
# A GitHub-hosted runner is told by the runner's own variables, GITHUB_ACTIONS=true and
# RUNNER_ENVIRONMENT=github-hosted (a self-hosted runner says self-hosted). sudo's env_reset
# drops both: run it as `sudo --preserve-env=GITHUB_ACTIONS,RUNNER_ENVIRONMENT bash ...`
# (build-cells.yml does). --dry-run says what it would do and stops before touching anything.
set -euo pipefail
force=false
dry_run=false
for arg in "$@"; do
  case "$arg" in
    --force) force=true ;;
    --dry-run) dry_run=true ;;
    *) echo "usage: scripts/ci-docker-on-mnt.sh [--force] [--dry-run]" >&2; exit 2 ;;
  esac
done
free_gb() { df -P -BG "$1" 2>/dev/null | awk 'NR == 2 { sub("G", "", $4); print $4 }'; }
root_free="$(free_gb /)"
mnt_free="$(free_gb /mnt || echo 0)"
room="/: ${root_free:-0} GB free, /mnt: ${mnt_free:-0} GB free"
if ! $force; then
  if [ "${GITHUB_ACTIONS:-}" != true ] || [ "${RUNNER_ENVIRONMENT:-}" != github-hosted ]; then
    echo "docker stays where it is: not a GitHub-hosted runner (GITHUB_ACTIONS=${GITHUB_ACTIONS:-unset}, RUNNER_ENVIRONMENT=${RUNNER_ENVIRONMENT:-unset}; $room)" >&2
    exit 0
  fi
  if [ "${mnt_free:-0}" -le "${root_free:-0}" ]; then
    echo "docker stays where it is: /mnt has no more room than / ($room)" >&2
    exit 0
  fi
fi
if $dry_run; then
  echo "dry run: would move docker's data root to /mnt/docker and TMPDIR to /mnt/tmp, then restart docker ($room)" >&2
  exit 0
fi
mkdir -p /mnt/docker /mnt/tmp
chmod 1777 /mnt/tmp
python3 - <<'PY'
import json, pathlib
p = pathlib.Path("/etc/docker/daemon.json")
cfg = json.loads(p.read_text()) if p.exists() and p.read_text().strip() else {}
cfg["data-root"] = "/mnt/docker"
p.parent.mkdir(parents=True, exist_ok=True)
p.write_text(json.dumps(cfg, indent=2) + "\n")
PY
systemctl restart docker
docker info --format 'docker data root: {{.DockerRootDir}}' >&2
echo "TMPDIR=/mnt/tmp"
