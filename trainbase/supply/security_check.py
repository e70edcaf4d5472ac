"""The scheduled security check: which OS rows' published images miss a fix the distro's
security suite has published since they were built -- without pulling any image.

What an image has is its SBOM (every Debian package with its version: trainbase/supply/sbom.py);
what the distro has fixed is the security suite's package index (``<codename>-security``,
``Packages.xz`` of each component, read with python-debian and compared with Debian's version
ordering). A package of the image with a newer version in the security suite is a pending
fix. A row with one gets today's date as its rebuild epoch in locks/security-rebuilds.json
(define/security_rebuilds.py), which gives its cells new tags: the refresh pull request
(refresh.yml) carries it, and the usual build -> gate -> promote flow ships it.

The command is `python -m trainbase.deliver.security_rebuild` (it reads the SBOMs from the
registry or from files).
"""

from __future__ import annotations

import json
import lzma
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from ..errors import TrainbaseError

Fetch = Callable[[str], bytes]  # URL -> the bytes it serves

# Where each distro publishes its security suite (the images' own apt sources say the same).
# Ubuntu serves arm64 from ports; Debian serves every architecture from one archive.
SECURITY_ARCHIVES = {
    ("debian", "amd64"): ("http://deb.debian.org/debian-security", ("main",)),
    ("debian", "arm64"): ("http://deb.debian.org/debian-security", ("main",)),
    ("ubuntu", "amd64"): ("http://security.ubuntu.com/ubuntu", ("main", "universe", "restricted", "multiverse")),
    ("ubuntu", "arm64"): ("http://ports.ubuntu.com/ubuntu-ports", ("main", "universe", "restricted", "multiverse")),
}


@dataclass(frozen=True)
class PendingFix:
    package: str
    installed: str
    fixed: str

    def describe(self, suite: str) -> str:
        return f"{self.package} {self.installed} -> {self.fixed} ({suite})"


@dataclass(frozen=True)
class ImageFacts:
    cell: str
    os_row: str  # matrix.yaml's OS row (debian12, ubuntu22.04)
    os_id: str  # debian | ubuntu
    codename: str
    arch: str
    debs: dict[str, str]  # binary package -> installed version


def read_sbom(path: Path) -> ImageFacts:
    """The facts the check needs from one image's CycloneDX SBOM (or from a DSSE-signed
    in-toto statement whose predicate is one, as attached in the registry)."""
    from packageurl import PackageURL

    try:
        doc = json.loads(Path(path).read_text())
        if "predicate" in doc and doc.get("predicateType") == "https://cyclonedx.org/bom":
            doc = doc["predicate"]
        meta = doc["metadata"]["component"]
        props = {p["name"]: p["value"] for p in meta.get("properties", [])}
        debs: dict[str, str] = {}
        arches: set[str] = set()
        for c in doc.get("components", []):
            purl = PackageURL.from_string(c["purl"]) if c.get("purl", "").startswith("pkg:deb/") else None
            if purl and purl.version is not None:  # (sbom.py writes every deb with its version)
                debs[purl.name] = purl.version
                if purl.qualifiers.get("arch") not in (None, "all"):
                    arches.add(purl.qualifiers["arch"])
        facts = ImageFacts(
            meta["name"],
            props["trainbase:components.os.id"],
            props["trainbase:os.ID"],
            props["trainbase:os.VERSION_CODENAME"],
            sorted(arches)[0] if len(arches) == 1 else "",
            debs,
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TrainbaseError(f"{path}: not a trainbase SBOM ({type(e).__name__}: {e})") from None
    if not facts.debs or not facts.arch:
        raise TrainbaseError(f"{path}: the SBOM names no Debian packages of one architecture: nothing can be checked")
    return facts


def security_index(os_id: str, codename: str, arch: str, fetch: Fetch | None = None) -> dict[str, str]:
    """Binary package -> newest version in ``<codename>-security`` (every component)."""
    from debian import deb822
    from debian.debian_support import Version

    try:
        archive, components = SECURITY_ARCHIVES[(os_id, arch)]
    except KeyError:
        raise TrainbaseError(f"no security archive known for {os_id} on {arch}") from None
    fetch = fetch or _fetch
    newest: dict[str, str] = {}
    for comp in components:
        url = f"{archive}/dists/{codename}-security/{comp}/binary-{arch}/Packages.xz"
        text = lzma.decompress(fetch(url)).decode("utf-8", "replace")
        for para in deb822.Packages.iter_paragraphs(text.splitlines(keepends=True), use_apt_pkg=False):
            name, version = para.get("Package"), para.get("Version")
            if name and version and (name not in newest or Version(version) > Version(newest[name])):
                newest[name] = version
    return newest


def _fetch(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=120) as r:  # noqa: S310 -- SECURITY_ARCHIVES' http(s) URLs only
            data: bytes = r.read()
            return data
    except OSError as e:
        raise TrainbaseError(f"security index {url} could not be read ({e}): nothing was checked") from None


def pending(facts: ImageFacts, index: dict[str, str]) -> list[PendingFix]:
    from debian.debian_support import Version

    return [
        PendingFix(name, installed, index[name])
        for name, installed in sorted(facts.debs.items())
        if name in index and Version(index[name]) > Version(installed)
    ]


def check(sboms: list[Path], today: date, fetch: Fetch | None = None) -> dict[str, dict[str, Any]]:
    """OS row -> {"epoch": today, "fixes": [...]} for every row with a pending fix."""
    indexes: dict[tuple[str, str, str], dict[str, str]] = {}
    rows: dict[str, dict[str, Any]] = {}
    for path in sboms:
        f = read_sbom(path)
        key = (f.os_id, f.codename, f.arch)
        if key not in indexes:
            indexes[key] = security_index(*key, fetch=fetch)
        fixes = pending(f, indexes[key])
        suite = f"{f.codename}-security"
        print(f"{f.cell}: {len(fixes)} security fix(es) pending of {len(f.debs)} Debian packages ({suite}, {f.arch})")
        for fix in fixes:
            print(f"  {fix.describe(suite)}")
        if fixes:
            row = rows.setdefault(f.os_row, {"epoch": today.isoformat(), "fixes": []})
            row["fixes"] = sorted(set(row["fixes"]) | {fix.describe(suite) for fix in fixes})
    return rows
