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

from collections.abc import Iterable
from typing import Protocol, TextIO

from trainbase_common.states import JobState

from . import registry

ALIAS = "latest"          # the moving alias next to each immutable tag (promote.py moves it)
ZSTD = "-zstd"            # suffix of an immutable tag's zstd twin, and of latest's (latest-zstd)


class Publishable(Protocol):
    name: str
    image: str            # namespace/name:immutable-tag (local)
    tag: str
    parent: str | None
    status: JobState
    pushed: list[str]
    repo_digest: str | None


def publish(jobs: Iterable[Publishable], registry_arg: str, tag_local, out: TextIO, zstd_twin: bool = False) -> int:
    """Push every publishable job (parents first); returns how many cells were published.
    ``tag_local(src, dst)`` tags an image in the engine. With ``zstd_twin`` each immutable tag
    also gets ``TAG-zstd`` (registry side, written once like the tag itself). Raises
    registry.RegistryError (or its auth subclass) on the first answer that is not a clear
    present/absent."""
    host, ns = registry.split_registry(registry_arg)
    published: set[str] = set()
    for j in jobs:
        if not j.status.usable:
            out.write(f"publish: {j.name}: not published ({j.status})\n")
            continue
        if j.parent and j.parent not in published:
            out.write(f"publish: {j.name}: not published (its parent {j.parent} is not)\n")
            continue
        repo = f"{ns}/{j.name}"
        target = f"{host}/{repo}:{j.tag}"
        if registry.tag_state(host, repo, j.tag) == "present":
            out.write(f"publish: {j.name}: {target} already published (immutable; left as is)\n")
        else:
            tag_local(j.image, target)
            j.repo_digest = registry.push(host, target)
            j.pushed.append(target)
            out.write(f"publish: {j.name}: pushed {target} {j.repo_digest}\n")
        if zstd_twin:
            twin = f"{target}{ZSTD}"
            if registry.tag_state(host, repo, f"{j.tag}{ZSTD}") == "present":
                out.write(f"publish: {j.name}: {twin} already published (immutable; left as is)\n")
            else:
                registry.zstd_twin(target, twin)
                j.pushed.append(twin)
                out.write(f"publish: {j.name}: wrote {twin} (zstd layers)\n")
        published.add(j.name)
    return len(published)
