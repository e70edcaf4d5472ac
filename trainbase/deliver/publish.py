"""Publishing built cells to a registry: `--push --registry HOST[:PORT]/NAMESPACE`.

Rules:
- only a cell whose build completed (built, or cached from an earlier complete build) is
  pushed; a failed cell, and every cell built on it, publishes nothing;
- a framework cell is pushed only when its parent is published too (its layers build on it);
- only the immutable tag (the recipe hash) is pushed, and never overwritten: if the registry
  already has it, it is left as it is. The moving alias (`latest`) is NOT touched here:
  promotion (promote.py) retags it registry side, by digest, after the gate passed -- so a
  parent re-published by a child's job, or two jobs racing, can never move it;
- the registry is asked with the user's credentials (registry.py); if it refuses them, or
  cannot say whether a tag exists, publishing stops with that error: nothing is pushed blindly.

This module knows jobs only through the few fields it reads and writes (no import of the
build executor): what it publishes is what the caller hands it, parents first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Protocol, TextIO

from trainbase_common.states import JobState

from . import registry

ALIAS = "latest"  # the moving alias next to each immutable tag (promote.py moves it)
ZSTD = "-zstd"  # suffix of an immutable tag's zstd twin, and of latest's (latest-zstd)


class Publishable(Protocol):
    # read here, never set: read-only members, which plan.Job's properties satisfy (as plain
    # attributes they declared a settable field that Job does not have)
    @property
    def name(self) -> str: ...
    @property
    def repository(self) -> str: ...  # the published repository (every platform of one recipe shares it)
    @property
    def platform(self) -> str: ...  # OCI platform, linux/amd64

    image: str  # namespace/name:immutable-tag (local)

    @property
    def tag(self) -> str: ...
    @property
    def parent(self) -> str | None: ...

    status: JobState
    pushed: list[str]
    present: list[str]  # what was already published (immutable, left as is): it may lack attestations
    repo_digest: str | None


def release_tag(tags: list[str]) -> str:
    """The tag one repository is published under: the cell's own recipe tag when one platform
    is published, else a tag derived from every platform's recipe tag -- immutable like them,
    so a change to either platform's recipe is a new index, never a rewritten one."""
    if len(tags) == 1:
        return tags[0]
    return "r" + hashlib.sha256("\n".join(sorted(tags)).encode()).hexdigest()[:12]


def releases(items: list[tuple[str, str]]) -> dict[str, str]:
    """(repository, recipe tag) of each selected cell -> repository -> the tag it is published
    under (what publish pushes and promote moves ``latest`` to)."""
    by_repo: dict[str, list[str]] = {}
    for repo, tag in items:
        by_repo.setdefault(repo, []).append(tag)
    return {repo: release_tag(tags) for repo, tags in by_repo.items()}


# attest(job, repository, tag): attach signed statements to what REPOSITORY:TAG names (attest.py)
Attach = Callable[[Publishable, str, str], None]
TagLocal = Callable[[str, str], None]  # tag_local(src, dst): engine.tag

STAGING = "staging"  # <namespace>/staging/<cell name>: one platform's image, until its index is made


def staging_repo(ns: str, cell_name: str) -> str:
    return f"{ns}/{STAGING}/{cell_name}"


def publish(
    jobs: Iterable[Publishable],
    registry_arg: str,
    tag_local: TagLocal,
    out: TextIO,
    zstd_twin: bool = False,
    platforms: dict[str, set[str]] | None = None,
    attest: Attach | None = None,
) -> int:
    """Push every publishable job (parents first); returns how many cells were published.
    Jobs that share a repository (the platforms of one recipe) are published together as one
    multi-arch image index under one tag, or not at all: a platform that failed leaves the
    repository unpublished, never a tag that holds only the platforms that happened to build.
    ``tag_local(src, dst)`` tags an image in the engine. With ``zstd_twin`` each single-platform
    immutable tag also gets ``TAG-zstd`` (registry side, written once like the tag itself).
    ``platforms``: repository -> every platform the matrix builds it for. A run that holds only
    some of them (CI builds each platform on its own runner) stages each platform's image under
    ``<namespace>/staging/<cell name>:<recipe tag>`` instead, and ``build.py --merge-platforms``
    (deliver/platforms.py) makes the index once every platform is staged.
    ``attest(job, repo, tag)`` (deliver/attest.py), when given, attaches the signed SBOM and
    provenance to what each tag names -- also to a tag that was already there, which gets
    what it lacks; the zstd twin (``TAG-zstd``, what ``latest-zstd`` points to) is another digest
    and gets its own.
    Raises registry.RegistryError (or its auth subclass) on the first answer that is not a clear
    present/absent."""
    host, ns = registry.split_registry(registry_arg)
    jobs = list(jobs)
    groups: dict[str, list[Publishable]] = {}
    for j in jobs:
        groups.setdefault(j.repository, []).append(j)
    by_name = {j.name: j for j in jobs}

    def depth(j: Publishable) -> int:
        d = 0
        while j.parent and j.parent in by_name:
            j, d = by_name[j.parent], d + 1
        return d

    # parents first: a repository's platforms are all one level, and one level's groups go
    # before the next's (a child of either platform needs its own platform's parent published)
    order = sorted(groups.values(), key=lambda g: max(depth(j) for j in g))
    published: set[str] = set()
    for group in order:
        bad = [j for j in group if not j.status.usable]
        orphans = [j for j in group if j.parent and j.parent not in published]
        if bad or orphans:
            why = (
                f"{'its ' + bad[0].platform + ' image is ' if len(group) > 1 else ''}{bad[0].status}"
                if bad
                else f"its parent {orphans[0].parent} is not"
            )
            for j in group:
                out.write(f"publish: {j.name}: not published ({why})\n")
            continue
        wanted = (platforms or {}).get(group[0].repository, {j.platform for j in group})
        if {j.platform for j in group} != wanted:
            for j in group:
                _publish_one(
                    j,
                    host,
                    staging_repo(ns, j.name),
                    tag_local,
                    out,
                    False,
                    note=f"staged; the index comes with `--merge-platforms` once {', '.join(sorted(wanted))} are",
                )
                if attest:
                    attest(j, staging_repo(ns, j.name), j.tag)
        elif len(group) == 1:
            _publish_one(group[0], host, f"{ns}/{group[0].repository}", tag_local, out, zstd_twin)
            if attest:
                for tag in [group[0].tag] + [group[0].tag + ZSTD] * zstd_twin:
                    attest(group[0], f"{ns}/{group[0].repository}", tag)
        else:
            _publish_index(group, host, ns, out, zstd_twin)
            tag = release_tag([g.tag for g in group])
            if attest:
                for j in group:
                    for t in [tag] + [tag + ZSTD] * zstd_twin:
                        attest(j, f"{ns}/{j.repository}", t)
        published.update(j.name for j in group)
    return len(published)


def _publish_one(
    j: Publishable, host: str, repo: str, tag_local: TagLocal, out: TextIO, zstd_twin: bool, note: str = ""
) -> None:
    target = f"{host}/{repo}:{j.tag}"
    note = f" ({note})" if note else ""
    if (found := registry.digest(host, repo, j.tag)) is not None:
        # recorded with its digest: a run whose attestation step failed after the push left it
        # unattested, and the next run (this one) is the one that can still attest it
        j.repo_digest = found
        j.present.append(target)
        out.write(f"publish: {j.name}: {target} already published (immutable; left as is){note}\n")
    else:
        tag_local(j.image, target)
        j.repo_digest = registry.push(host, target)
        j.pushed.append(target)
        out.write(f"publish: {j.name}: pushed {target} {j.repo_digest}{note}\n")
    if zstd_twin:
        twin = f"{target}{ZSTD}"
        if registry.tag_state(host, repo, f"{j.tag}{ZSTD}") == "present":
            j.present.append(twin)
            out.write(f"publish: {j.name}: {twin} already published (immutable; left as is)\n")
        else:
            registry.zstd_twin(target, twin)
            j.pushed.append(twin)
            out.write(f"publish: {j.name}: wrote {twin} (zstd layers)\n")


def _publish_index(group: list[Publishable], host: str, ns: str, out: TextIO, zstd_twin: bool) -> None:
    repo = f"{ns}/{group[0].repository}"
    tag = release_tag([j.tag for j in group])
    target = f"{host}/{repo}:{tag}"
    plats = ", ".join(sorted(j.platform for j in group))
    if (found := registry.digest(host, repo, tag)) is not None:
        for j in group:
            j.repo_digest = found
            j.present.append(target)
        out.write(f"publish: {group[0].repository}: {target} already published ({plats}; immutable; left as is)\n")
    else:
        digest = registry.push_index(host, target, {j.platform: j.image for j in group})
        for j in group:
            j.repo_digest = digest
            j.pushed.append(target)
        out.write(f"publish: {group[0].repository}: pushed the image index {target} {digest} ({plats})\n")
    if zstd_twin:
        index_twin(host, repo, tag, out, group[0].repository)


def index_twin(host: str, repo: str, tag: str, out: TextIO, name: str) -> None:
    """TAG-zstd of a multi-arch index: every platform recompressed, one index (written once)."""
    twin = f"{host}/{repo}:{tag}{ZSTD}"
    if registry.tag_state(host, repo, f"{tag}{ZSTD}") == "present":
        out.write(f"publish: {name}: {twin} already published (immutable; left as is)\n")
        return
    registry.zstd_twin(f"{host}/{repo}:{tag}", twin)
    out.write(f"publish: {name}: wrote {twin} (every platform's layers zstd)\n")
