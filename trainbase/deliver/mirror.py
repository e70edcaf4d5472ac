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
   `gh attestation verify` / `build.py --verify-attestations` work against the mirror too;
4. the same for the ``-zstd`` twin (``TAG-zstd``, then ``latest-zstd``) where the primary's
   ``latest-zstd`` names it (promotion moves it only on the twin's own records).

Each repository is mirrored on its own: one that fails is reported (``FAILED``) and the next
one still goes; the run exits 1 naming every one that failed. The primary's and the mirrors'
logins may live in separate DOCKER_CONFIG directories (``--from-config``/``--to-config``): a
mirror on the primary's host (`kind: ghcr` under another owner) would otherwise overwrite the
primary's login in the one config.json, keyed by host.

Each mirror's ``latest`` is then read back and must be the primary's digest. Registries that
need a repository created before the first push get it (ECR: ``aws ecr create-repository``,
tags immutable except the aliases ``latest*``, scan on push; the others create repositories
on push). Configuration: ``--to`` once per
mirror, or the JSON list in ``TRAINBASE_MIRRORS`` (``[{"registry": "HOST/NS"}, ...]``).
docs/registries.md says how each is logged in to and who can pull (visibility).

    python -m trainbase.deliver.mirror --from HOST/NS [--to HOST/NS ...] [--from-config DIR] [--to-config DIR]
        [--profile P] [--select K=V]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from ..errors import TrainbaseError
from . import referrers, registry
from .publish import ALIAS, ZSTD

Run = Callable[..., subprocess.CompletedProcess[str]]
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
        p = run(
            [*base, "describe-repositories", "--repository-names", repo], capture_output=True, text=True, timeout=120
        )
        if p.returncode == 0:
            return
        if "RepositoryNotFoundException" not in (p.stderr or ""):
            raise TrainbaseError(
                f"ECR {host}: cannot say whether {repo} exists: {(p.stderr or p.stdout).strip()[-300:]}"
            )
        # immutable: a release tag (r<hash>, and its -zstd twin) is written once and no key of
        # the mirror's can overwrite it; only the aliases promotion moves (latest, latest-zstd)
        # are excluded. ECR's own scan runs on each push.
        p = run(
            [
                *base,
                "create-repository",
                "--repository-name",
                repo,
                "--image-tag-mutability",
                "IMMUTABLE_WITH_EXCLUSION",
                "--image-tag-mutability-exclusion-filters",
                f"filterType=WILDCARD,filter={ALIAS}*",
                "--image-scanning-configuration",
                "scanOnPush=true",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except FileNotFoundError:
        raise TrainbaseError(f"ECR {host}: the aws CLI is needed to create {repo} (GitHub's runners have it)") from None
    if p.returncode != 0:
        raise TrainbaseError(f"ECR {host}: could not create {repo}: {(p.stderr or p.stdout).strip()[-300:]}")
    out.write(f"mirror: created ECR repository {host}/{repo}\n")


@contextmanager
def credentials(config: Path | None) -> Iterator[None]:
    """Ask with the logins stored in CONFIG (a DOCKER_CONFIG directory), where given: the
    primary and a mirror on the same host (`kind: ghcr` under another owner) have two logins,
    and one config.json keyed by host holds only one (the second `docker login` overwrote the
    first). The engine client and the referrers client are made per DOCKER_CONFIG."""
    if config is None:
        yield
        return
    before = os.environ.get("DOCKER_CONFIG")
    os.environ["DOCKER_CONFIG"] = str(config)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DOCKER_CONFIG", None)
        else:
            os.environ["DOCKER_CONFIG"] = before


def mirror_one(
    src: str,
    dst: str,
    repo: str,
    tag: str,
    out: TextIO,
    run: Run = subprocess.run,
    clients: dict[str, referrers.Client] | None = None,
    src_config: Path | None = None,
    dst_config: Path | None = None,
) -> str:
    """Mirror REPO (release TAG and latest, and their ``-zstd`` twins where the primary
    promoted one) from SRC to DST (HOST/NS each), each asked with its own logins
    (``src_config``/``dst_config``: DOCKER_CONFIG directories); what was done."""
    shost, sns = registry.split_registry(src)
    dhost, dns = registry.split_registry(dst)
    with credentials(src_config):
        digest = registry.digest(shost, f"{sns}/{repo}", ALIAS)
        if digest is None:
            return "not promoted in the primary: nothing to mirror"
        if registry.digest(shost, f"{sns}/{repo}", tag) != digest:
            return f"latest is not the release tag {tag} in the primary (not promoted yet): left as it is"
        # the twin's alias moves only on its own records (promote.py): mirrored when it names TAG-zstd
        twin = registry.digest(shost, f"{sns}/{repo}", f"{ALIAS}{ZSTD}")
        if twin is not None and registry.digest(shost, f"{sns}/{repo}", f"{tag}{ZSTD}") != twin:
            twin = None
    with credentials(dst_config):
        ensure_repository(dhost, f"{dns}/{repo}", out, run)
    done = []
    pairs = [(tag, ALIAS, digest)] + ([(f"{tag}{ZSTD}", f"{ALIAS}{ZSTD}", twin)] if twin else [])
    for release, alias, want in pairs:
        with credentials(dst_config):
            now = registry.digest(dhost, f"{dns}/{repo}", release)
        if now is None:
            registry.retag(
                f"{shost}/{sns}/{repo}@{want}",
                f"{dhost}/{dns}/{repo}:{release}",
                src_config=src_config,
                dst_config=dst_config,
            )
            done.append(f"{release} copied")
        elif now != want:
            raise TrainbaseError(
                f"mirror {dhost}/{dns}/{repo}:{release} is {now}, the primary's is {want}: an "
                "immutable tag differs between registries; left as it is, fix by hand"
            )
        with credentials(dst_config):
            if registry.digest(dhost, f"{dns}/{repo}", alias) != want:
                registry.retag(
                    f"{dhost}/{dns}/{repo}@{want}",
                    f"{dhost}/{dns}/{repo}:{alias}",
                    src_config=dst_config,
                    dst_config=dst_config,
                )
                if registry.digest(dhost, f"{dns}/{repo}", alias) != want:
                    raise TrainbaseError(f"mirror {dhost}/{dns}/{repo}:{alias} does not name {want} after the retag")
                done.append(f"{alias} -> {want}")
    clients = clients if clients is not None else {}
    for host, config in ((shost, src_config), (dhost, dst_config)):
        if f"{host} {config}" not in clients:
            with credentials(config):  # a client reads DOCKER_CONFIG's logins once, when made
                clients[f"{host} {config}"] = referrers.Client(host)
    sc, dc = clients[f"{shost} {src_config}"], clients[f"{dhost} {dst_config}"]
    n = 0
    for d in [x for x in (digest, twin) if x]:
        subject = sc.descriptor(f"{sns}/{repo}", d)
        subjects = [subject]
        if subject.media_type in (referrers.OCI_INDEX, referrers.DOCKER_LIST):  # attestations are per platform
            subjects = [
                referrers.Descriptor.from_json(m)
                for m in json.loads((sc.manifest(f"{sns}/{repo}", d) or (b"{}", ""))[0]).get("manifests", [])
            ]
        n += sum(sc.copy_referrers(f"{sns}/{repo}", f"{dns}/{repo}", s, dst=dc) for s in subjects)
    if n:
        done.append(f"{n} attestation(s)")
    return ", ".join(done) or "already current"


def mirror_all(
    src: str, targets: list[str], tags: dict[str, str | None], out: TextIO, mirror: Callable[[str, str, str], str]
) -> list[str]:
    """Every repository (``tags``: repository -> its release tag, None when nothing of it can
    be published) to every mirror, one at a time and each on its own: a repository that fails
    (a registry that refuses it, an immutable tag that differs) is reported and the next one
    still goes -- one broken repository must not leave every other mirror stale. The failures,
    ``MIRROR/REPO: why``, in order."""
    failures = []
    for dst in targets:
        for repo, tag in sorted(tags.items()):
            if not tag:
                out.write(f"mirror: {dst}/{repo}: NOT mirrored: nothing of it can be published\n")
                failures.append(f"{dst}/{repo}: nothing of it can be published")
                continue
            try:
                out.write(f"mirror: {dst}/{repo}: {mirror(dst, repo, tag)}\n")
            except (TrainbaseError, registry.RegistryError) as e:
                out.write(f"mirror: {dst}/{repo}: FAILED: {e}\n")
                failures.append(f"{dst}/{repo}: {e}")
    return failures


def mirrors_from_env() -> list[str]:
    raw = os.environ.get("TRAINBASE_MIRRORS", "").strip()
    if not raw:
        return []
    try:
        return [str(e["registry"]) for e in json.loads(raw)]
    except (ValueError, TypeError, KeyError) as e:
        raise TrainbaseError(f'TRAINBASE_MIRRORS: expected [{{"registry": "HOST/NS"}}, ...] ({e})') from None


def main(argv: list[str] | None = None) -> int:
    from ..define.matrix import load, parse_selects
    from ..render import recipes as rendermod
    from .platforms import publishable

    p = argparse.ArgumentParser(prog="python -m trainbase.deliver.mirror", description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="src", required=True, metavar="HOST/NS", help="the primary registry")
    p.add_argument("--to", action="append", default=[], metavar="HOST/NS", help="a mirror (repeatable)")
    p.add_argument(
        "--from-config",
        type=Path,
        metavar="DIR",
        help="the DOCKER_CONFIG holding the primary's login (default: DOCKER_CONFIG)",
    )
    p.add_argument(
        "--to-config",
        type=Path,
        metavar="DIR",
        help="the DOCKER_CONFIG holding the mirrors' logins, kept apart from the primary's",
    )
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
    except TrainbaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    clients: dict[str, referrers.Client] = {}
    failures = mirror_all(
        a.src,
        targets,
        {repo: r.tag for repo, r in releases.items()},
        sys.stdout,
        lambda dst, repo, tag: mirror_one(
            a.src, dst, repo, tag, sys.stdout, clients=clients, src_config=a.from_config, dst_config=a.to_config
        ),
    )
    if failures:
        print(f"error: {len(failures)} repository(ies) not mirrored (the others were):", file=sys.stderr)
        for f in failures:
            print(f"error:   {f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
