"""What an image has (not what it claims: that is the manifest): its OS packages, its Python
distributions, the components trainbase builds from source or ships, and where its base came
from. Read from the built image; the SBOM, the audits, the input lock and the release notes
are written from it. JSON round-trips, so a report's inventory can be compared with a later
build's."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("deb", "pypi", "component")  # component: built from source or shipped by trainbase


@dataclass(frozen=True, order=True)
class Package:
    """One installed thing. ``source`` is the Debian source package for debs (what security
    trackers name), the download URL for a component built from a pinned tarball."""

    kind: str
    name: str
    version: str
    arch: str = ""
    source: str = ""
    sha256: str = ""  # of the artifact it was built from, when trainbase downloaded one

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"package kind {self.kind!r} not in {KINDS}")
        if not self.name or not self.version:
            raise ValueError(f"package without a name or version: {self}")


@dataclass(frozen=True)
class Inventory:
    cell: str  # the cell's name (also the image's repository name)
    tag: str  # the immutable recipe tag, r<12 hex>
    image_id: str  # the engine's image id (sha256:...)
    os: dict[str, str]  # /etc/os-release: ID, VERSION_ID, VERSION_CODENAME, PRETTY_NAME
    base: dict[str, str]  # {"ref": "debian:12.15-slim", "identity": "<digest or package-list sha256>", "how": ...}
    packages: tuple[Package, ...] = ()
    manifest: dict[str, Any] = field(default_factory=dict)

    def of_kind(self, kind: str) -> list[Package]:
        return [p for p in self.packages if p.kind == kind]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["packages"] = [asdict(p) for p in sorted(self.packages)]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Inventory:
        return cls(
            cell=d["cell"],
            tag=d["tag"],
            image_id=d["image_id"],
            os=dict(d["os"]),
            base=dict(d["base"]),
            packages=tuple(sorted(Package(**p) for p in d["packages"])),
            manifest=dict(d.get("manifest") or {}),
        )
