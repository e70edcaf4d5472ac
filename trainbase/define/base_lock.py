"""The committed lock of the OS rows' base images: ``locks/bases.json``.

Without it one recipe tag could name different images on different machines or days: the
same Dockerfile built FROM whatever ``debian:12.15-slim`` resolves to there (the official
image where Docker Hub answers, a fresh debootstrap where it does not). With it:

- every root cell's recipe hash folds in its base's locked identity, so the tag names one base;
- the lock says where the base comes from. ``bootstrap``: trainbase's own debootstrap, even
  where the official image could be pulled, identified by the digest of its dpkg package list
  (the list itself is in the lock, so a moved base is named package by package).
  ``registry digest``: the official image, identified by its manifest digest;
- the build resolves the base and refuses the row's cells when it is not what the lock says,
  naming locked and resolved identity; re-locking (``build.py --lock-bases``) is a deliberate
  change that gives every cell of the row a new tag (the scheduled refresh proposes it as a PR).
  Both ask the engine, and live in build/bases.py; this module is the file and what the recipe reads.

A base with no identity in the lock (a registry base where it was last locked no registry
answered, e.g. nvidia/cuda on a machine without Docker Hub) is "unlocked": it builds FROM its
tag as before, its resolved digest recorded in the image's labels, and its cells' tags say so
("unlocked" is what their recipe folds in).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainbase_common import engine, safe_io

from ..errors import TrainbaseError
from .invocation import build_py

LOCK_FILE = "locks/bases.json"
SCHEMA = 1
BOOTSTRAP = "bootstrap"
REGISTRY = "registry digest"


@dataclass(frozen=True)
class BaseLock:
    ref: str  # the row's base as matrix.yaml names it (debian:12.15-slim)
    how: str  # BOOTSTRAP or REGISTRY
    identity: str | None  # packages-sha256:<hex> / sha256:<hex>; None: unlocked
    packages: list[str] = field(default_factory=list)  # bootstrap: "name version", sorted
    note: str = ""  # why an entry is unlocked, where it was resolved
    # the image config's Env ("NAME=value", as the engine lists it), where lock-bases read the
    # config (a bootstrap); None: not recorded (render/env_contract.py uses the base family's contract)
    env: list[str] | None = None

    def recipe_line(self) -> str:
        """What a root cell's recipe hash folds in for its base."""
        return f"base {self.ref} {self.how} {self.identity or 'unlocked'}\n"

    @property
    def digest(self) -> str | None:
        """The manifest digest a registry-locked base is pinned to; None for a bootstrap or an
        unlocked entry."""
        return self.identity if self.how == REGISTRY and self.identity else None

    def from_ref(self) -> str:
        """What the Dockerfile's FROM names: ``name:tag@sha256:...`` for a registry-locked base
        (BuildKit resolves the digest and ignores the tag, which stays for the reader), else
        the tag. A moved tag upstream then cannot change what the recipe builds FROM."""
        return f"{self.ref}@{self.digest}" if self.digest else self.ref

    def engine_ref(self) -> str:
        """How the engine is asked for the locked base: ``name@sha256:...`` (the engine's
        reference store does not take a tag and a digest together), else the tag."""
        return f"{engine.repository(self.ref)}@{self.digest}" if self.digest else self.ref


def key(ref: str, platform: str | None) -> str:
    """The lock's key for ``ref`` built for ``platform`` (None: the first platform of the axis,
    which keeps the bare ref). A bootstrap is one architecture's package list, so each platform
    has its own entry; a registry base's digest is its multi-arch index, shared by all."""
    return f"{ref} {platform}" if platform else ref


def unlocked(ref: str, how: str, note: str = "") -> BaseLock:
    return BaseLock(ref=ref, how=how, identity=None, note=note)


def load(root: Path) -> dict[str, BaseLock]:
    """The committed entries by base ref; {} when there is no lock file yet."""
    p = root / LOCK_FILE
    if not p.exists():
        return {}
    try:
        data = json.loads(p.read_text())
        if not isinstance(data, dict):  # `[]` or `null`: what a hand edit or a bad merge leaves
            raise ValueError(f"must be a JSON object, got {type(data).__name__}")
        if data.get("schema") != SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}, this trainbase reads {SCHEMA}")
        out = {}
        for ref, e in data["bases"].items():
            if e["how"] not in (BOOTSTRAP, REGISTRY):
                raise ValueError(f"{ref}: how must be {BOOTSTRAP!r} or {REGISTRY!r}, not {e['how']!r}")
            out[ref] = BaseLock(
                ref=ref.split(" ", 1)[0],
                how=e["how"],
                identity=e.get("identity"),
                packages=list(e.get("packages") or []),
                note=e.get("note", ""),
                env=[str(v) for v in e["env"]] if isinstance(e.get("env"), list) else None,
            )
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise TrainbaseError(f"{LOCK_FILE}: unreadable: {e} (re-create it with `{build_py()} lock-bases`)") from None


def write(root: Path, entries: dict[str, BaseLock]) -> None:
    doc: dict[str, Any] = {"schema": SCHEMA, "bases": {}}
    for k in sorted(entries):
        e = asdict(entries[k])
        del e["ref"]
        if e["env"] is None:  # not recorded: no key, so a lock written before the field reads the same
            del e["env"]
        doc["bases"][k] = e
    (root / LOCK_FILE).parent.mkdir(parents=True, exist_ok=True)
    safe_io.atomic_write(root / LOCK_FILE, json.dumps(doc, indent=2, sort_keys=True) + "\n")


def entry_for(entries: dict[str, BaseLock], base_key: str, bootstrappable: bool) -> BaseLock:
    """The lock of a base (``key(ref, platform)``); a registry base of another platform shares
    its index's entry; an unlocked entry of the row's kind when the file has none."""
    ref = base_key.split(" ", 1)[0]
    if base_key in entries:
        return entries[base_key]
    if not bootstrappable and ref in entries:
        return entries[ref]
    return unlocked(ref, BOOTSTRAP if bootstrappable else REGISTRY, f"{base_key} not in {LOCK_FILE}")


def package_changes(locked: list[str], now: list[str], limit: int = 8) -> str:
    """`libc6 2.36-9+deb12u10 -> 2.36-9+deb12u13, +foo 1.0, -bar 2.1` (the first ``limit``)."""
    old = dict(p.split(" ", 1) for p in locked if " " in p)
    new = dict(p.split(" ", 1) for p in now if " " in p)
    changes = [f"{n} {old[n]} -> {new[n]}" for n in sorted(old.keys() & new.keys()) if old[n] != new[n]]
    changes += [f"+{n} {new[n]}" for n in sorted(new.keys() - old.keys())]
    changes += [f"-{n} {old[n]}" for n in sorted(old.keys() - new.keys())]
    more = f" (and {len(changes) - limit} more)" if len(changes) > limit else ""
    return ", ".join(changes[:limit]) + more if changes else "the same package list"


def mismatch(lock: BaseLock, resolved: dict[str, str], packages: list[str] | None) -> str | None:
    """Why the resolved base is not the locked one, or None (an unlocked entry always passes)."""
    if not lock.identity:
        return None
    if resolved.get("identity") == lock.identity:
        return None
    what = (
        f"base {lock.ref} is not the locked one: locked {lock.identity}, resolved "
        f"{resolved.get('identity') or 'nothing'} ({resolved.get('how', '?')} {resolved.get('ref', '')})"
    )
    if lock.how == BOOTSTRAP and packages is not None:
        what += f"; packages: {package_changes(lock.packages, packages)}"
    return (
        what + f". If the new base is wanted, re-lock it with `{build_py()} lock-bases` "
        "(every cell of the row gets a new tag) and commit locks/bases.json"
    )
