"""One repository, several platforms: which platforms the matrix builds each repository for,
and `build.py --merge-platforms`, which publishes the multi-arch index of every selected
repository from the platform images its runners staged.

CI builds each platform on its own runner (arm64 on ubuntu-24.04-arm), so no single job holds
both images. Each job therefore stages its platform's image (`--push stage`: publish.py pushes
it to ``<namespace>/staging/<cell name>:<recipe tag>``); when the level's jobs are done, one job
runs `--merge-platforms`, which pushes each repository's index over its staged platform
manifests, copied registry side byte for byte (the digests the builds attested). A
repository whose platforms are not all staged is named with what is missing and nothing is
pushed for it (exit 1): never an index that holds only what happened to build.

Which cells a selection publishes, and so under which release tag each repository is found, is
decided once, here (``publishable``): the CI plan, this merge, promotion, mirroring and the
attestation checks all ask it, so none of them looks for a tag over a platform no runner built.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ..build.plan import Plan
from ..define.matrix import Cell, Matrix
from ..errors import TrainbaseError
from ..render import recipes as rendermod
from ..render.recipes import Rendered
from . import registry
from .publish import index_twin, release_tag, staging_repo


@dataclass
class Release:
    """One repository as a selection publishes it (``publishable``)."""

    repository: str
    cells: list[Cell] = field(default_factory=list)  # what it publishes: one cell per platform
    tags: dict[str, str] = field(default_factory=dict)  # cell name -> recipe tag, of those cells
    left_out: dict[str, str] = field(default_factory=dict)  # its selected cells that are never built -> why

    @property
    def tag(self) -> str | None:
        """The tag the repository is published under (publish.release_tag over the recipe tags
        of the cells it publishes); None: nothing of it can be published."""
        return release_tag(list(self.tags.values())) if self.tags else None

    @property
    def platforms(self) -> set[str]:
        return {c.platform for c in self.cells}

    def why_not(self) -> str:
        """Why the left-out cells are left out, one clause each (for the messages that name them)."""
        return "; ".join(f"{name}: {why}" for name, why in sorted(self.left_out.items()))


def publishable(m: Matrix, rendered: dict[str, Rendered], selected: list[Cell]) -> dict[str, Release]:
    """Repository -> its Release, for every repository a selected cell belongs to: the selected
    cells that can be built -- not refused (an artifact without a verified checksum: the Ubuntu
    arm64 twins until Miniforge's aarch64 sha256 was pinned) and not built on a parent
    that is -- and the release tag over their recipe tags. A repository whose every selected cell
    is left out has no tag (``Release.tag`` None): nothing of it is ever published. ``rendered``
    holds every selected cell and its parents (render_all)."""
    plan = Plan(m, rendered, selected)
    plan.refuse_unverified()
    plan.propagate()
    out: dict[str, Release] = {}
    for c in selected:
        job = plan.jobs[c.name]
        release = out.setdefault(job.repository, Release(job.repository))
        if job.status.bad:
            release.left_out[c.name] = job.reason or str(job.status)
        else:
            release.cells.append(c)
            release.tags[c.name] = job.tag
    return out


def expected(m: Matrix, root: Path) -> dict[str, set[str]]:
    """repository -> the platforms the matrix can build it for (a platform whose cell is refused
    -- an artifact without a verified checksum -- is not expected)."""
    releases = publishable(m, rendermod.render_all(m, root=root), m.included)
    return {repo: r.platforms for repo, r in releases.items() if r.cells}


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


def _index_of_staged(host: str, repo: str, tag: str, staged: dict[str, tuple[str, str]]) -> str:
    """Push REPO:TAG, an OCI image index over the staged platform images (platform ->
    (staging repository, tag)), registry side; its digest. Each platform's manifest is copied
    byte for byte -- its digest is the one the build attested (signed SBOM and provenance, or
    CI's keyless bundles), so those attestations name what the index serves -- with its blobs
    mounted across repositories. (Copying through an OCI layout would convert Docker
    manifests to OCI ones: new digests, and every attestation naming a digest no pull gets.)
    The platforms' manifests go in untagged, then the one tag: never a moment where TAG names
    one platform only."""
    import json

    from . import referrers

    client = referrers.Client(host)
    children = []
    for platform, (src, src_tag) in sorted(staged.items()):
        got = client.manifest(src, src_tag)
        if got is None:
            raise registry.RegistryError(f"registry {host} has no staged {src}:{src_tag}")
        data, media_type = got
        if media_type in (referrers.OCI_INDEX, referrers.DOCKER_LIST):
            raise registry.RegistryError(f"{src}:{src_tag} is an index, not one platform's image")
        doc = json.loads(data)
        for blob in [doc["config"], *doc.get("layers", [])]:
            client.copy_blob(src, repo, blob["digest"])
        digest = referrers.sha256(data)
        client.put_manifest(repo, digest, data, media_type)
        os_, arch = platform.split("/", 1)
        children.append(
            {
                "mediaType": media_type,
                "digest": digest,
                "size": len(data),
                "platform": {"architecture": arch, "os": os_},
            }
        )
    index = json.dumps(
        {"schemaVersion": 2, "mediaType": referrers.OCI_INDEX, "manifests": children}, separators=(",", ":")
    ).encode()
    client.put_manifest(repo, tag, index, referrers.OCI_INDEX)
    return referrers.sha256(index)


def merge_command(
    m: Matrix,
    root: Path,
    selected: list[Cell],
    registry_arg: str | None,
    out: TextIO = sys.stdout,
    zstd_twin: bool = False,
) -> int:
    if not registry_arg:
        raise TrainbaseError("--merge-platforms needs --registry HOST[:PORT]/NAMESPACE")
    host, ns = registry.split_registry(registry_arg)
    rendered = rendermod.render_all(m, selected, root=root)
    merged = missing_any = 0
    for repo, release in sorted(publishable(m, rendered, selected).items()):
        if release.left_out:
            # never built, so never staged: the index is made of the platforms that are
            out.write(f"merge: {repo}: left out, never built: {release.why_not()}\n")
        if len(release.cells) < 2:
            continue  # one platform (or none): published as it is by --push
        cells, tags = release.cells, release.tags
        target = f"{host}/{ns}/{repo}:{release.tag}"
        if registry.tag_state(host, f"{ns}/{repo}", target.rsplit(":", 1)[1]) == "present":
            out.write(f"merge: {repo}: {target} already published\n")
            # and attested? A build whose attestation step failed after the push left its
            # platform manifests without them; its re-attested staged images' attestations are
            # carried now (copy_referrers copies only what the index's repository lacks)
            _carry_attestations(host, ns, repo, cells, tags, out)
            if zstd_twin:
                index_twin(host, f"{ns}/{repo}", target.rsplit(":", 1)[1], out, repo)
            continue
        staged = {
            c.platform for c in cells if registry.tag_state(host, staging_repo(ns, c.name), tags[c.name]) == "present"
        }
        absent = sorted(c.platform for c in cells if c.platform not in staged)
        if absent:
            missing_any += 1
            out.write(f"merge: {repo}: NOT published: no staged image for {', '.join(absent)}\n")
            continue
        assert release.tag is not None  # noqa: S101 -- two cells or more (above): their tags make one
        digest = _index_of_staged(
            host, f"{ns}/{repo}", release.tag, {c.platform: (staging_repo(ns, c.name), tags[c.name]) for c in cells}
        )
        merged += 1
        out.write(f"merge: {repo}: pushed the image index {target} {digest} ({', '.join(sorted(staged))})\n")
        _carry_attestations(host, ns, repo, cells, tags, out)
        if zstd_twin:
            index_twin(host, f"{ns}/{repo}", target.rsplit(":", 1)[1], out, repo)
    out.write(f"merge: {merged} index(es) pushed, {missing_any} repository(ies) missing a platform\n")
    return 1 if missing_any else 0
