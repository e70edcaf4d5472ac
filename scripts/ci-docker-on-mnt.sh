#!/usr/bin/env bash
# Hosted GitHub runners have ~20 GB free on / and a second, mostly empty disk on /mnt (~70 GB).
# A framework cell holds its parent, its image and a `docker save` stream for the waste audit
# (35-40 GB): move Docker's data root and the job's scratch space (TMPDIR) to /mnt when /mnt has
# more room than /, and say what was done. Elsewhere (a self-hosted runner, a laptop) it changes
# nothing unless asked to with --force.
#   scripts/ci-docker-on-mnt.sh [--force]      (root, or sudo; prints the TMPDIR to use)
set -euo pipefail
free_gb() { df -P -BG "$1" 2>/dev/null | awk 'NR == 2 { sub("G", "", $4); print $4 }'; }
root_free="$(free_gb /)"
mnt_free="$(free_gb /mnt || echo 0)"
if [ "${1:-}" != --force ] && { [ "${GITHUB_ACTIONS:-}" != true ] || [ "${mnt_free:-0}" -le "$root_free" ]; }; then
  echo "docker stays where it is (/: ${root_free} GB free, /mnt: ${mnt_free:-0} GB free)" >&2
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
