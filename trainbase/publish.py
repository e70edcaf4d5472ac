"""Publishing built cells to a registry: `--push --registry HOST[:PORT]/NAMESPACE`.

Rules:
- only a cell whose build completed (built, or cached from an earlier complete build) is
  pushed; a failed cell, and every cell built on it, publishes nothing;
- a framework cell is pushed only when its parent is published too (its layers build on it);
- the immutable tag (the recipe hash) is pushed first and never overwritten: if the
  registry already has it, it is left as it is; only then does the moving alias follow;
- if the registry cannot say whether a tag exists, nothing is pushed for that cell.
"""

from __future__ import annotations

import re
import ssl
import subprocess
import urllib.error
import urllib.request

from . import engine
from .errors import TrainbaseError

ACCEPT = ", ".join([
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
])


def split_registry(registry: str) -> tuple[str, str]:
    host, sep, ns = registry.partition("/")
    if not sep or not host or not ns or not re.fullmatch(r"[a-z0-9]+([._/-][a-z0-9]+)*", ns):
        raise TrainbaseError(f"--registry {registry!r}: expected HOST[:PORT]/NAMESPACE (e.g. 127.0.0.1:5000/trainbase)")
    return host, ns


def _insecure(host: str) -> bool:
    return host.split(":")[0] in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")


def remote_tag(host: str, repo: str, tag: str, timeout: float = 15) -> str:
    """'present', 'absent', or 'unknown: why' for HOST/REPO:TAG (registry v2 API)."""
    scheme = "http" if _insecure(host) else "https"
    req = urllib.request.Request(f"{scheme}://{host}/v2/{repo}/manifests/{tag}", method="HEAD",
                                 headers={"Accept": ACCEPT})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=None if scheme == "http" else ssl.create_default_context()):
            return "present"
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return "absent"
        return f"unknown: HTTP {e.code} from {host}"
    except (urllib.error.URLError, OSError) as e:
        return f"unknown: {host} unreachable ({getattr(e, 'reason', e)})"


def _docker(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([engine.docker_cli(), *args], capture_output=True, text=True, timeout=timeout)


def _push(ref: str) -> tuple[bool, str]:
    r = _docker("push", ref)
    out = (r.stdout + r.stderr).strip()
    if r.returncode != 0:
        return False, out.splitlines()[-1] if out else f"docker push exited {r.returncode}"
    m = re.search(r"digest: (sha256:[0-9a-f]{64})", out)
    return True, m.group(1) if m else ""


def push_jobs(b, registry: str, out) -> None:
    from .builder import ALIAS, OK_STATES

    host, ns = split_registry(registry)
    published: set[str] = set()
    for j in b.jobs.values():                                   # parents come first
        if j.status not in OK_STATES:
            out.write(f"publish: {j.name}: not published ({j.status})\n")
            continue
        if j.cell.parent and j.cell.parent not in published:
            out.write(f"publish: {j.name}: not published (its parent {j.cell.parent} is not)\n")
            continue
        repo = f"{ns}/{j.name}"
        target, alias = f"{host}/{repo}:{j.tag}", f"{host}/{repo}:{ALIAS}"
        state = remote_tag(host, repo, j.tag)
        if state.startswith("unknown"):
            out.write(f"publish: {j.name}: NOT pushed: cannot tell whether {target} exists ({state[9:]}); "
                      f"an immutable tag is never overwritten blindly\n")
            continue
        if state == "present":
            out.write(f"publish: {j.name}: {target} already published (immutable; left as is)\n")
        else:
            _docker("tag", j.image, target)
            ok, info = _push(target)
            if not ok:
                out.write(f"publish: {j.name}: push of {target} FAILED: {info}\n")
                continue
            j.repo_digest = info or None
            j.pushed.append(target)
            out.write(f"publish: {j.name}: pushed {target} {info}\n")
        _docker("tag", j.image, alias)
        ok, info = _push(alias)
        if ok:
            j.pushed.append(alias)
        else:
            out.write(f"publish: {j.name}: alias {alias} FAILED: {info}\n")
        published.add(j.name)
