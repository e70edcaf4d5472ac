"""Mirrors: what was promoted in the primary registry, copied by digest to more registries
(ACR, ECR, Docker Hub, another GHCR namespace) -- `python -m trainbase.deliver.mirror`.

The primary registry (``vars.TRAINBASE_REGISTRY``) is where images are staged, gated and
promoted; a mirror never builds or decides anything. For each selected repository whose
``latest`` the primary has, the mirror gets, registry to registry (skopeo, nothing through
a runner's engine):

1. the release tag (immutable: written once, with the primary's digest, or left as it is);
2. ``latest`` retagged by that digest (only after 1., so a mirror's ``latest`` never names
   something its immutable tag does not);
3. the attestations attached to the digest (signed SBOM and provenance: OCI referrers), so
   `gh attestation verify` / `build.py --verify-attestations` work against the mirror too.

Each mirror's ``latest`` is then read back and must be the primary's digest. Registries that
need a repository created before the first push get it (ECR: ``aws ecr create-repository``,
scan on push; the others create repositories on push). Configuration: ``--to`` once per
mirror, or the JSON list in ``TRAINBASE_MIRRORS`` (``[{"registry": "HOST/NS"}, ...]``).
docs/registries.md says how each is logged in to and who can pull (visibility).

    python -m trainbase.deliver.mirror --from HOST/NS [--to HOST/NS ...] [--profile P] [--select K=V]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ..errors import TrainbaseError
from . import referrers, registry
from .publish import ALIAS

Run = Callable[..., subprocess.CompletedProcess]
_ECR = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com$")


def kind(host: str) -> str:
    """ghcr | acr | ecr | dockerhub | other: what the registry needs before a push."""
    if host == "ghcr.io":
        return "ghcr"
    if host.endswith(".azurecr.io"):
        return "acr"
    if _ECR.match(host):
        return "ecr"
    if host in ("docker.io", "registry-1.docker.io", "index.docker.io"):
        return "dockerhub"
    return "other"


def ensure_repository(host: str, repo: str, out: TextIO, run: Run = subprocess.run) -> None:
    """Create REPO where the registry does not on push (ECR); a no-op elsewhere."""
    m = _ECR.match(host)
    if not m:
        return
    base = ["aws", "ecr", "--region", m["region"], "--registry-id", m["account"], "--output", "json"]
    try:
        p = run([*base, "describe-repositories", "--repository-names", repo], capture_output=True, text=True, timeout=120)
        if p.returncode == 0:
            return
        if "RepositoryNotFoundException" not in (p.stderr or ""):
            raise TrainbaseError(f"ECR {host}: cannot say whether {repo} exists: {(p.stderr or p.stdout).strip()[-300:]}")
        # latest moves by promotion, so tags stay mutable; ECR's own scan runs on each push
        p = run([*base, "create-repository", "--repository-name", repo, "--image-tag-mutability", "MUTABLE",
                 "--image-scanning-configuration", "scanOnPush=true"], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise TrainbaseError(f"ECR {host}: the aws CLI is needed to create {repo} (GitHub's runners have it)") from None
    if p.returncode != 0:
        raise TrainbaseError(f"ECR {host}: could not create {repo}: {(p.stderr or p.stdout).strip()[-300:]}")
    out.write(f"mirror: created ECR repository {host}/{repo}\n")


def mirror_one(src: str, dst: str, repo: str, tag: str, out: TextIO, run: Run = subprocess.run,
               clients: dict[str, referrers.Client] | None = None) -> str:
    """Mirror REPO (release TAG and latest) from SRC to DST (HOST/NS each); what was done."""
    shost, sns = registry.split_registry(src)
    dhost, dns = registry.split_registry(dst)
    digest = registry.digest(shost, f"{sns}/{repo}", ALIAS)
    if digest is None:
        return "not promoted in the primary: nothing to mirror"
    if registry.digest(shost, f"{sns}/{repo}", tag) != digest:
        return f"latest is not the release tag {tag} in the primary (not promoted yet): left as it is"
    ensure_repository(dhost, f"{dns}/{repo}", out, run)
    done = []
    now = registry.digest(dhost, f"{dns}/{repo}", tag)
    if now is None:
        registry.retag(f"{shost}/{sns}/{repo}@{digest}", f"{dhost}/{dns}/{repo}:{tag}")
        done.append(f"{tag} copied")
    elif now != digest:
        raise TrainbaseError(f"mirror {dhost}/{dns}/{repo}:{tag} is {now}, the primary's is {digest}: an immutable "
                             "tag differs between registries; left as it is, fix by hand")
    if registry.digest(dhost, f"{dns}/{repo}", ALIAS) != digest:
        registry.retag(f"{dhost}/{dns}/{repo}@{digest}", f"{dhost}/{dns}/{repo}:{ALIAS}")
        if registry.digest(dhost, f"{dns}/{repo}", ALIAS) != digest:
            raise TrainbaseError(f"mirror {dhost}/{dns}/{repo}:{ALIAS} does not name {digest} after the retag")
        done.append(f"{ALIAS} -> {digest}")
    clients = clients if clients is not None else {}
    sc = clients.setdefault(shost, referrers.Client(shost))
    dc = clients.setdefault(dhost, referrers.Client(dhost))
    subject = sc.descriptor(f"{sns}/{repo}", digest)
    subjects = [subject]
    if subject.media_type in (referrers.OCI_INDEX, referrers.DOCKER_LIST):   # attestations are per platform
        subjects = [referrers.Descriptor.from_json(m) for m in
                    json.loads((sc.manifest(f"{sns}/{repo}", digest) or (b"{}", ""))[0]).get("manifests", [])]
    n = sum(sc.copy_referrers(f"{sns}/{repo}", f"{dns}/{repo}", s, dst=dc) for s in subjects)
    if n:
        done.append(f"{n} attestation(s)")
    return ", ".join(done) or "already current"


def mirrors_from_env() -> list[str]:
    raw = os.environ.get("TRAINBASE_MIRRORS", "").strip()
    if not raw:
        return []
    try:
        return [str(e["registry"]) for e in json.loads(raw)]
    except (ValueError, TypeError, KeyError) as e:
        raise TrainbaseError(f"TRAINBASE_MIRRORS: expected [{{\"registry\": \"HOST/NS\"}}, ...] ({e})") from None


def main(argv: list[str] | None = None) -> int:
    from ..define.matrix import load, parse_selects
    from ..render import recipes as rendermod
    from .platforms import publishable

    p = argparse.ArgumentParser(prog="python -m trainbase.deliver.mirror", description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="src", required=True, metavar="HOST/NS", help="the primary registry")
    p.add_argument("--to", action="append", default=[], metavar="HOST/NS", help="a mirror (repeatable)")
    p.add_argument("--file", type=Path, default=Path("matrix.yaml"))
    p.add_argument("--profile")
    p.add_argument("--select", action="append", metavar="KEY=VALUE")
    a = p.parse_args(argv)
    try:
        targets = a.to or mirrors_from_env()
        if not targets:
            print("mirror: no mirror configured (--to, or TRAINBASE_MIRRORS): nothing to do")
            return 0
        m = load(a.file)
        filters = parse_selects(a.select)
        selected = m.select(filters, a.profile) if (filters or a.profile) else m.included
        rendered = rendermod.render_all(m, selected, root=m.path.resolve().parent)
        # the release tag promotion moved latest to: over the platforms that are built (platforms.py)
        releases = publishable(m, rendered, selected)
        never = sorted(repo for repo, r in releases.items() if not r.tag)
        clients: dict[str, referrers.Client] = {}
        for dst in targets:
            for repo, r in sorted(releases.items()):
                if r.tag:
                    print(f"mirror: {dst}/{repo}: {mirror_one(a.src, dst, repo, r.tag, sys.stdout, clients=clients)}")
                else:
                    print(f"mirror: {dst}/{repo}: NOT mirrored: nothing of it can be published ({r.why_not()})")
    except TrainbaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if never:
        print(f"error: nothing publishable, so nothing to mirror, for {', '.join(never)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
