"""One repository, several platforms: which platforms the matrix builds each repository for,
and `build.py --merge-platforms`, which publishes the multi-arch index of every selected
repository from the platform images its runners staged.

CI builds each platform on its own runner (arm64 on ubuntu-24.04-arm), so no single job holds
both images. Each job therefore stages its platform's image (`--push stage`: publish.py pushes
it to ``<namespace>/staging/<cell name>:<recipe tag>``); when the level's jobs are done, one job
runs `--merge-platforms`, which copies every staged platform image of a repository into one OCI
layout and pushes the index under the repository's release tag (registry.push_index). A
repository whose platforms are not all staged is named with what is missing and nothing is
pushed for it (exit 1): never an index that holds only what happened to build.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from ..build.plan import Plan
from ..define.matrix import Cell, Matrix
from ..errors import TrainbaseError
from ..render import recipes as rendermod
from . import registry
from .publish import index_twin, release_tag, staging_repo


def expected(m: Matrix, root: Path) -> dict[str, set[str]]:
    """repository -> the platforms the matrix can build it for (a platform whose cell is refused
    -- an artifact without a verified checksum -- is not expected)."""
    rendered = rendermod.render_all(m, root=root)
    plan = Plan(m, rendered, m.included)
    plan.refuse_unverified()
    plan.propagate()
    out: dict[str, set[str]] = {}
    for name, job in plan.jobs.items():
        if not job.status.bad:
            out.setdefault(job.repository, set()).add(job.cell.platform)
    return out


def _carry_attestations(host: str, ns: str, repo: str, cells: list[Cell], tags: dict[str, str], out: TextIO) -> None:
    """What the build attached to each staged platform image (signed SBOM and provenance:
    attest.py, or keyless Sigstore bundles in CI) is attached to the same digest in the
    published repository: referrers live per repository, and the index only copied manifests."""
    from . import referrers

    client = referrers.Client(host)
    for c in cells:
        subject = client.descriptor(staging_repo(ns, c.name), tags[c.name])
        n = client.copy_referrers(staging_repo(ns, c.name), f"{ns}/{repo}", subject)
        if n:
            out.write(f"merge: {repo}: {n} attestation(s) of its {c.platform} image carried over\n")


def merge_command(m: Matrix, root: Path, selected: list[Cell], registry_arg: str | None,
                  out: TextIO = sys.stdout, zstd_twin: bool = False) -> int:
    if not registry_arg:
        raise TrainbaseError("--merge-platforms needs --registry HOST[:PORT]/NAMESPACE")
    host, ns = registry.split_registry(registry_arg)
    rendered = rendermod.render_all(m, selected, root=root)
    groups: dict[str, list[Cell]] = {}
    for c in selected:
        groups.setdefault(c.image or c.name, []).append(c)
    merged = missing_any = 0
    for repo, cells in sorted(groups.items()):
        if len(cells) < 2:
            continue                            # one platform: published as it is by --push
        tags = {c.name: rendered[c.name].tag for c in cells}
        target = f"{host}/{ns}/{repo}:{release_tag(list(tags.values()))}"
        if registry.tag_state(host, f"{ns}/{repo}", target.rsplit(":", 1)[1]) == "present":
            out.write(f"merge: {repo}: {target} already published\n")
            if zstd_twin:
                index_twin(host, f"{ns}/{repo}", target.rsplit(":", 1)[1], out, repo)
            continue
        staged = {c.platform: f"docker://{host}/{staging_repo(ns, c.name)}:{tags[c.name]}" for c in cells
                  if registry.tag_state(host, staging_repo(ns, c.name), tags[c.name]) == "present"}
        absent = sorted(c.platform for c in cells if c.platform not in staged)
        if absent:
            missing_any += 1
            out.write(f"merge: {repo}: NOT published: no staged image for {', '.join(absent)}\n")
            continue
        digest = registry.push_index(host, target, staged)
        merged += 1
        out.write(f"merge: {repo}: pushed the image index {target} {digest} ({', '.join(sorted(staged))})\n")
        _carry_attestations(host, ns, repo, cells, tags, out)
        if zstd_twin:
            index_twin(host, f"{ns}/{repo}", target.rsplit(":", 1)[1], out, repo)
    out.write(f"merge: {merged} index(es) pushed, {missing_any} repository(ies) missing a platform\n")
    return 1 if missing_any else 0
