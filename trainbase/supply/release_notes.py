"""Release notes for one tag of a cell, in Markdown, from two Inventories (this build's and the
cell's previous one): which manifest components changed version, which packages were added,
removed, upgraded or downgraded, and which security advisories this build fixes. Every list is
sorted, so the same two inventories always give the same text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

from .inventory import KINDS, Inventory, Package

KIND_TITLES = {
    "deb": "Debian packages",
    "pypi": "Python distributions",
    "component": "Components trainbase builds or ships",
}
ARROW = "→"


# -- Debian's version ordering (Debian Policy 5.6.12, as dpkg implements it) --------------------
def _split_deb(version: str) -> tuple[int, str, str]:
    """[epoch:]upstream[-revision]; the revision follows the last hyphen, a missing one is empty."""
    epoch, colon, rest = version.partition(":")
    if not colon:
        epoch, rest = "0", version
    if not epoch.isdigit():
        raise ValueError(f"not a Debian version (epoch {epoch!r}): {version!r}")
    upstream, hyphen, revision = rest.rpartition("-")
    return (int(epoch), upstream, revision) if hyphen else (int(epoch), rest, "")


def _order(char: str) -> int:
    """dpkg's weight of one non-digit: ~ before the end of the string, the end before letters,
    letters before everything else."""
    if char == "~":
        return -1
    if char.isascii() and char.isalpha():
        return ord(char)
    return ord(char) + 256


def _lead(run: re.Pattern[str], s: str) -> tuple[str, str]:
    """S cut after its leading RUN (a pattern that also matches the empty string)."""
    m = run.match(s)
    head = m.group() if m else ""
    return head, s[len(head) :]


_TEXT, _DIGITS = re.compile(r"\D*"), re.compile(r"\d*")


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternate runs of non-digits (compared by _order, shorter run padded with
    the end-of-string weight 0) and runs of digits (compared as numbers)."""
    while a or b:
        a_text, a = _lead(_TEXT, a)
        b_text, b = _lead(_TEXT, b)
        for i in range(max(len(a_text), len(b_text))):
            ac = _order(a_text[i]) if i < len(a_text) else 0
            bc = _order(b_text[i]) if i < len(b_text) else 0
            if ac != bc:
                return -1 if ac < bc else 1
        a_num, a = _lead(_DIGITS, a)
        b_num, b = _lead(_DIGITS, b)
        if int(a_num or 0) != int(b_num or 0):
            return -1 if int(a_num or 0) < int(b_num or 0) else 1
    return 0


def compare_deb_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as Debian version ``a`` sorts before, with or after ``b``."""
    (a_epoch, a_up, a_rev), (b_epoch, b_up, b_rev) = _split_deb(a), _split_deb(b)
    if a_epoch != b_epoch:
        return -1 if a_epoch < b_epoch else 1
    return _compare_part(a_up, b_up) or _compare_part(a_rev, b_rev)


def compare_versions(kind: str, a: str, b: str) -> int | None:
    """-1, 0 or 1 under the rules of the package's own manager; None where versions have no order:
    a content digest (trainbase-tools, a key's fingerprint) or a version PEP 440 cannot read."""
    if kind == "pypi":
        try:
            va, vb = Version(a), Version(b)
        except InvalidVersion:
            return None
        return (va > vb) - (va < vb)
    if kind == "component" and any(re.fullmatch(r"[0-9a-f]{12,}", v) and not v.isdigit() for v in (a, b)):
        return None
    # Components' upstream versions (4.1.4, 2021.18.1, 1.20.1~rc1) order the same under dpkg's rules.
    return compare_deb_versions(a, b)


# -- package changes -----------------------------------------------------------------------------
def _normalized(pypi_name: str) -> str:
    """PEP 503: PyYAML, pyyaml and py_yaml are one distribution."""
    return re.sub(r"[-_.]+", "-", pypi_name).lower()


def _key(pkg: Package) -> tuple[str, str]:
    """What makes two packages of two builds "the same package": a deb per architecture, a Python
    distribution under its normalized name."""
    if pkg.kind == "pypi":
        return _normalized(pkg.name), ""
    return pkg.name, pkg.arch


@dataclass
class PackageChanges:
    """One kind's differences, each list of (label, old version, new version), sorted by label."""

    added: list[tuple[str, str, str]] = field(default_factory=list)
    removed: list[tuple[str, str, str]] = field(default_factory=list)
    upgraded: list[tuple[str, str, str]] = field(default_factory=list)
    downgraded: list[tuple[str, str, str]] = field(default_factory=list)
    changed: list[tuple[str, str, str]] = field(default_factory=list)  # different, but not orderable


def package_changes(current: Inventory, previous: Inventory, kind: str) -> PackageChanges:
    new = {_key(p): p for p in current.of_kind(kind)}
    old = {_key(p): p for p in previous.of_kind(kind)}
    arches: dict[str, set[str]] = {}
    for name, arch in new.keys() | old.keys():
        arches.setdefault(name, set()).add(arch)

    def label(key: tuple[str, str]) -> str:  # name:arch only where a name comes in several architectures
        pkg = new.get(key) or old[key]
        return f"{pkg.name}:{pkg.arch}" if len(arches[key[0]]) > 1 else pkg.name

    out = PackageChanges()
    for key in sorted(new.keys() | old.keys()):
        before, after = old.get(key), new.get(key)
        if after is not None and before is None:  # (the key is new's or old's: one of them)
            out.added.append((label(key), "", after.version))
        elif before is not None and after is None:
            out.removed.append((label(key), before.version, ""))
        elif before is not None and after is not None and before.version != after.version:
            order = compare_versions(kind, before.version, after.version)
            bucket = {-1: out.upgraded, 1: out.downgraded}.get(order, out.changed) if order else out.changed
            bucket.append((label(key), before.version, after.version))
    for bucket in (out.added, out.removed, out.upgraded, out.downgraded, out.changed):
        bucket.sort()
    return out


# -- manifest components -------------------------------------------------------------------------
def _with_source(version: Any, source: Any) -> str:
    return f"{version} ({source})" if version and source else str(version or "")


def component_versions(manifest: dict[str, Any]) -> dict[str, str]:
    """The versions a user of the image chooses it by, in a fixed order, frameworks last by name.
    Where a component came from is part of its row: CUDA from wheels or from the base image is a
    different image even at one version."""
    c = manifest.get("components") or {}
    cuda, mpi, ib = c.get("cuda") or {}, c.get("mpi") or {}, c.get("ib") or {}
    rows = {
        "Base image": (c.get("os") or {}).get("base") or "",
        "CUDA": _with_source(cuda.get("toolkit") or cuda.get("version"), cuda.get("from")),
        "cuDNN": str((c.get("cudnn") or {}).get("version") or ""),
        "NCCL": _with_source((c.get("nccl") or {}).get("version"), (c.get("nccl") or {}).get("from")),
        "MPI": " ".join(str(v) for v in (mpi.get("kind"), mpi.get("version")) if v),
        "UCX": _with_source((c.get("ucx") or {}).get("version"), (c.get("ucx") or {}).get("from")),
        "InfiniBand": " ".join(str(v) for v in (ib.get("kind"), ib.get("version")) if v),
        "Python": _with_source((c.get("python") or {}).get("version"), (c.get("python") or {}).get("manager")),
    }
    rows.update({name: str(version) for name, version in sorted((manifest.get("frameworks") or {}).items())})
    return {name: value for name, value in rows.items() if value}


# -- security ------------------------------------------------------------------------------------
def _installed_as(current: Inventory, package: str) -> list[Package]:
    """The packages an advisory's name points at: a deb by binary or source name, a Python
    distribution by normalized name."""
    return [
        p
        for p in current.packages
        if p.name == package
        or (p.kind == "deb" and p.source == package)
        or (p.kind == "pypi" and _normalized(p.name) == _normalized(package))
    ]


def fixed_in(current: Inventory, entry: dict[str, Any]) -> bool:
    """Whether this image no longer has the advisory's problem: every package it names is at or
    past the fixed version, or gone. The audits report what is still open with the same fields,
    so the notes say which of the two each entry is instead of trusting the list's name."""
    installed = _installed_as(current, entry["package"])
    fixed = entry.get("fixed") or ""
    if not installed:
        return True
    if not fixed:
        return False

    def at_or_past_fixed(pkg: Package) -> bool:
        order = compare_versions(pkg.kind, pkg.version, fixed)
        return pkg.version == fixed or (order is not None and order >= 0)

    return all(at_or_past_fixed(p) for p in installed)


def _cell(value: Any) -> str:
    return str(value or "—").replace("|", "\\|")


def _security_section(current: Inventory, security: list[dict[str, Any]]) -> list[str]:
    entries = sorted(
        security, key=lambda e: (str(e.get("advisory")), e["package"], e.get("installed") or "", e.get("fixed") or "")
    )
    is_fixed = [fixed_in(current, e) for e in entries]
    fixed = [e for e, done in zip(entries, is_fixed, strict=True) if done]
    still_open = [e for e, done in zip(entries, is_fixed, strict=True) if not done]
    lines = ["## Security fixes", ""]
    for title, group in (("Fixed by this build", fixed), ("Still open in this build", still_open)):
        if not group:
            continue
        lines += [f"{title}:", "", "| Advisory | Package | Affected version | Fixed in |", "| --- | --- | --- | --- |"]
        lines += [
            f"| {_cell(e.get('advisory'))} | {_cell(e['package'])} | {_cell(e.get('installed'))} "
            f"| {_cell(e.get('fixed'))} |"
            for e in group
        ]
        lines.append("")
    return lines if entries else lines + ["None.", ""]


# -- the document --------------------------------------------------------------------------------
def _change_lines(changes: PackageChanges) -> list[str]:
    lines = []
    for title, bucket in (
        ("Added", changes.added),
        ("Removed", changes.removed),
        ("Upgraded", changes.upgraded),
        ("Downgraded", changes.downgraded),
        ("Changed", changes.changed),
    ):
        if bucket:
            lines += [f"{title} ({len(bucket)}):", ""]
            for name, old, new in bucket:
                lines.append(f"- {name}: {old} {ARROW} {new}" if old and new else f"- {name} {old or new}")
            lines.append("")
    return lines or ["No change.", ""]


def release_notes(current: Inventory, previous: Inventory | None, security: list[dict[str, Any]] | None = None) -> str:
    """Markdown release notes for ``current``'s tag, compared with ``previous`` (None: the cell's
    first build). ``security``: advisories (package, installed, fixed, advisory) that the audits
    found; None where no audit ran, and the section is left out."""
    title = f"# {current.cell} {current.tag}"
    lines = [title + (f" (previous: {previous.tag})" if previous else ""), ""]
    lines += [
        f"Image `{current.image_id}`, base `{current.base.get('ref', '?')}`"
        + (f" (`{current.base['identity']}`)" if current.base.get("identity") else "")
        + ".",
        "",
    ]
    now = component_versions(current.manifest)
    lines += ["## Components", ""]
    if previous is None:
        lines += ["First build of this cell.", "", "| Component | Version |", "| --- | --- |"]
        lines += [f"| {name} | {_cell(version)} |" for name, version in now.items()]
        lines += ["", "## Packages", ""]
        lines += [f"- {KIND_TITLES[kind]}: {len(current.of_kind(kind))}" for kind in KINDS]
        lines.append("")
    else:
        before = component_versions(previous.manifest)
        changed = [name for name in {**before, **now} if before.get(name) != now.get(name)]
        if changed:
            lines += ["| Component | Previous | This build |", "| --- | --- | --- |"]
            lines += [f"| {name} | {_cell(before.get(name))} | {_cell(now.get(name))} |" for name in changed]
        else:
            lines.append("No component changed version.")
        lines += ["", "## Packages", ""]
        for kind in KINDS:
            lines += [f"### {KIND_TITLES[kind]}", ""] + _change_lines(package_changes(current, previous, kind))
    if security is not None:
        lines += _security_section(current, security)
    return "\n".join(lines).rstrip("\n") + "\n"
