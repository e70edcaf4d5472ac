"""The base image a root cell is built FROM, as the build finds it here: resolved against its
lock (``locks/bases.json``; define/base_lock.py reads it), identified, and recorded in the
image.

- ``resolve``: what to build FROM for one row's base -- the locked registry digest pulled, or
  trainbase's own debootstrap (bootstrap.py) -- and why the row's cells must not build when
  that is not the locked base (one fresh bootstrap first: an engine may hold an old one);
- ``relock``: ``build.py --lock-bases``, the same resolution written back into the lock;
- ``base_identity``: what a base is, here (a registry digest, a bootstrap's package-list
  digest, else the engine's image id);
- ``base_labels`` / ``recorded_base``: that identity in the labels of the image built FROM it
  (children inherit them), so a document made later reads the base the build saw.

The lock file's format and the recipe line it adds to every root tag stay in
define/base_lock.py, which the renderer reads; everything here asks the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import date
from pathlib import Path
from typing import Any

from trainbase_common import engine

from ..define import base_lock
from ..define.base_lock import BOOTSTRAP, REGISTRY, BaseLock
from ..define.matrix import Cell, Matrix
from ..errors import TrainbaseError
from ..render import context
from . import bootstrap


def resolve(
    ref: str, row: Any, lock: BaseLock, log: Callable[[str], object], arch: str | None = None
) -> tuple[str, str | None]:
    """(what to build FROM, why the row's cells must not build) for one base of a build. A
    bootstrap already in the engine that is not the locked one is made again once (an engine
    can hold one from before a Debian point release); what then still differs from the lock
    is refused, named."""
    suite = row.bootstrap.suite if row.bootstrap else None
    mirror = row.bootstrap.mirror if row.bootstrap else bootstrap.DEFAULT_MIRROR
    only = lock.how == BOOTSTRAP and row.bootstrap is not None
    if lock.digest:
        # pulled by the locked digest, never by the tag: a tag moved upstream is not a reason
        # to refuse the build (nor one to build FROM something else); no bootstrap stands in
        how, built_from = bootstrap.ensure_base_image(lock.engine_ref(), None, log=log, arch=arch)
        return built_from, (None if how == "registry index" else _differs(lock, built_from))
    how, built_from = bootstrap.ensure_base_image(ref, suite, mirror, log=log, bootstrap_only=only, arch=arch)
    why = _differs(lock, built_from)
    if why and how == "bootstrap present":
        log(f"{ref}: the bootstrap in the engine is not the locked one: making it again")
        engine.remove_image(built_from)
        how, built_from = bootstrap.ensure_base_image(ref, suite, mirror, log=log, bootstrap_only=only, arch=arch)
        why = _differs(lock, built_from)
    return built_from, why


def _differs(lock: BaseLock, built_from: str) -> str | None:
    if not lock.identity:
        return None
    resolved = base_identity(built_from)
    if resolved.get("identity") == lock.identity:
        return None
    packages = bootstrap.packages_of(built_from) if resolved.get("how") == "bootstrap" else None
    return base_lock.mismatch(lock, resolved, packages)


def used_bases(m: Matrix) -> set[str]:
    """Every lock key some included cell builds FROM: its base (per platform for a bootstrap,
    the bare ref for a registry index) and its compile stages' build base."""
    used: set[str] = set()
    for c in m.included:
        if not c.parent:
            os_ = context.build(m, c).data["os"]
            used |= {os_["base_key"], os_["base"]}
            if os_["build_base"]:
                used.add(os_["build_base"])
    return used


def relock(
    m: Matrix, root: Path, cells: Iterable[Cell], log: Callable[[str], object], refresh: bool = False
) -> dict[str, BaseLock]:
    """Resolve the bases of ``cells``' rows now and write the lock (other entries are kept).
    Without ``refresh`` only the bases with no entry yet are resolved (a new CUDA row's base):
    re-resolving a locked one moves the tag of every cell on it, which the weekly refresh does
    on purpose (``--lock-bases --all``) and adding a version must never do.
    A bootstrap row is bootstrapped afresh (what the mirror gives today); a registry row is
    resolved from the registry's manifest API (the engine's distribution endpoint, the stored
    login): its digest -- the multi-arch index where there is one -- without pulling a layer,
    so a refresh of eight CUDA devel bases reads eight small documents instead of filling the
    runner's disk. Every resolvable row is written; a row no registry answers for keeps its
    entry and fails the refresh (TrainbaseError naming each), never a silent "unresolved" note."""
    entries = base_lock.load(root)
    seen: dict[str, Any] = {}
    for c in cells:
        if not c.parent:
            os_ = context.build(m, c).data["os"]
            # a registry base is one index for every platform: resolved once, under its bare ref
            k = os_["base_key"] if m.spec.os[c.os].bootstrap is not None else os_["base"]
            seen.setdefault(k, (os_["base"], c.arch, m.spec.os[c.os]))
            if os_["build_base"]:  # the compile stages' base (a registry image, never bootstrapped)
                seen.setdefault(os_["build_base"], (os_["build_base"], c.arch, None))
    failures: list[str] = []
    for k, (ref, arch, row) in sorted(seen.items()):
        if not refresh and k in entries and entries[k].identity:
            log(f"{k}: locked to {entries[k].identity}, kept (--all re-resolves it)")
            continue
        if row is not None and row.bootstrap is not None:
            engine.remove_image(bootstrap.bootstrap_ref(ref, arch))  # today's mirror, not an old bootstrap
            _, own = bootstrap.ensure_base_image(
                ref, row.bootstrap.suite, row.bootstrap.mirror, log=log, bootstrap_only=True, arch=arch
            )
            ident = base_identity(own)
            entries[k] = BaseLock(
                ref=ref,
                how=BOOTSTRAP,
                identity=ident["identity"],
                packages=bootstrap.packages_of(own),
                note=f"debootstrap {row.bootstrap.suite} from {row.bootstrap.mirror}, {date.today()}",
                env=_CONFIG_ENV.get(own),
            )
            log(f"{k}: locked to {ident['identity']}")
            continue
        try:
            digest = engine.distribution_digest(ref)
        except engine.EngineError as e:
            failures.append(f"{ref}: {str(e).splitlines()[0][:200]}")
            if ref in entries:
                log(f"{ref}: NOT resolved, entry kept: {failures[-1]}")
            else:
                # docs/matrix.md's promise: a base no registry answered for gets an "unlocked"
                # entry saying why, so its cells build FROM the tag and their recipe says so
                entries[ref] = base_lock.unlocked(
                    ref,
                    REGISTRY,
                    f"unresolved {date.today()}: its registry did not answer the manifest request; "
                    "run `build.py lock-bases` where it does",
                )
                log(f"{ref}: NOT resolved, written as unlocked: {failures[-1]}")
            continue
        old = entries.get(ref)
        entries[ref] = BaseLock(
            ref=ref,
            how=REGISTRY,
            identity=digest,
            note=f"manifest digest from the registry, {date.today()}",
            # no config is read (nothing is pulled): an Env recorded for this very digest stays
            env=old.env if old and old.identity == digest else None,
        )
        log(f"{ref}: locked to {digest}" + (" (unchanged)" if old and old.identity == digest else ""))
    for k in sorted(set(entries) - used_bases(m)):
        log(f"{k}: no cell of the matrix uses it any more: entry dropped")
        del entries[k]
    base_lock.write(root, entries)
    if failures:
        raise TrainbaseError(
            f"--lock-bases: {len(failures)} base(s) could not be resolved from their registry "
            "(the others are written):\n  " + "\n  ".join(failures)
        )
    return entries


def drop_unused(m: Matrix, root: Path, log: Callable[[str], object]) -> list[str]:
    """Drop the entries of locks/bases.json no cell uses any more (a dropped CUDA version's
    bases), offline: `build.py lock` does it, so dropping a version is one edit and one command."""
    entries = base_lock.load(root)
    gone = sorted(set(entries) - used_bases(m))
    for k in gone:
        log(f"{k}: no cell of the matrix uses it any more: entry dropped")
        del entries[k]
    if gone:
        base_lock.write(root, entries)
    return gone


# The config Env of each image base_identity inspected, by ref: what `lock-bases` records as a
# base's environment (the environment contract, render/env_contract.py, starts a stage from it)
# without asking the engine a second time.
_CONFIG_ENV: dict[str, list[str]] = {}


def base_identity(ref: str) -> dict[str, str]:
    """What the row's base is, here: a registry digest when the engine has one, else the local
    bootstrap's package-list digest (its label), else the engine's image id."""
    info = engine.inspect_image(ref)
    if info is None:
        return {"ref": ref, "identity": "", "how": "absent"}
    _CONFIG_ENV[ref] = [str(v) for v in (info.raw.get("Config") or {}).get("Env") or []]
    labels = info.labels or {}
    digests = info.raw.get("RepoDigests") or []
    pinned = ref.partition("@")[2]
    if pinned and any(d.partition("@")[2] == pinned for d in digests):
        # asked for by digest (a registry-locked base): that digest is what it is, even when it
        # was made FROM a trainbase bootstrap and still carries the bootstrap's labels
        return {"ref": ref, "identity": pinned, "how": "registry digest"}
    if labels.get("io.trainbase.base.packages-sha256"):
        return {
            "ref": ref,
            "identity": "packages-sha256:" + labels["io.trainbase.base.packages-sha256"],
            "how": "bootstrap",
        }
    if digests:
        # an image pulled under several names has one digest per repository: take this ref's
        repo = _familiar(engine.repository(ref))
        own = [d for d in digests if _familiar(d.split("@", 1)[0]) == repo]
        return {"ref": ref, "identity": (own or digests)[0].split("@", 1)[1], "how": "registry digest"}
    return {"ref": ref, "identity": info.id, "how": "image id (no registry digest)"}


def _familiar(repo: str) -> str:
    """docker.io/library/debian -> debian: the form the engine prints in RepoDigests."""
    for prefix in ("docker.io/library/", "docker.io/", "index.docker.io/library/", "index.docker.io/"):
        if repo.startswith(prefix):
            return repo[len(prefix) :]
    return repo


# The base a root cell was built FROM, as the build saw it: labels written by `docker build
# --label` (and again by the SBOM layer), inherited by every child. A document made later for a
# cached or pulled image reads the base from here, never from whatever the engine resolves that
# day (which would give one tag two SBOMs).
BASE_LABELS = {"ref": "io.trainbase.base.ref", "identity": "io.trainbase.base.identity", "how": "io.trainbase.base.how"}


def base_labels(base: dict[str, str]) -> dict[str, str]:
    return {label: base.get(key, "") for key, label in BASE_LABELS.items()}


def recorded_base(labels: dict[str, str] | None) -> dict[str, str] | None:
    """The base recorded in an image's labels, or None for an image built before the record
    (an empty identity is no record either: nothing to lock a rebuild to)."""
    labels = labels or {}
    if not labels.get(BASE_LABELS["how"]) or not labels.get(BASE_LABELS["identity"]):
        return None
    return {key: labels.get(label, "") for key, label in BASE_LABELS.items()}
