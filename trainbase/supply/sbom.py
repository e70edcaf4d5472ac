"""An SBOM per image, in CycloneDX JSON, written from the image's Inventory (what the image
has, not what its manifest claims). The document is built with cyclonedx-python-lib's model
and serialized by its JSON outputter; only the choice of fields is ours.

Reproducible: the same inventory gives the same bytes. No timestamp; the serial number is a
uuid5 of the inventory's content; components are sorted (by the library) and their bom-refs
are their purls. The engine's image id is left out on purpose: it changes with bytes no build
pins (file mtimes, .pyc files) and with the SBOM layer itself, so two builds of the same lock
with the same packages give the same SBOM, which is what `build.py --locked` compares; the
build report names the image id."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import Any
from urllib.parse import urlparse

from cyclonedx.model import ExternalReference, ExternalReferenceType, HashAlgorithm, HashType, Property, XsUri
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output import make_outputter
from cyclonedx.schema import OutputFormat, SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL

from .inventory import Inventory, Package

# 1.6 rather than the library's newest: the version SBOM consumers (scanners, registries) read.
SPEC = SchemaVersion.V1_6
PROPERTY_NAMESPACE = "trainbase:"
# Fixed, so the serial number of an inventory is the same on every machine and every run.
SERIAL_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "trainbase/sbom")


def _prop(name: str, value: str) -> Property:
    return Property(name=PROPERTY_NAMESPACE + name, value=value)


def package_url(pkg: Package, os_release: dict[str, str]) -> PackageURL:
    """The purl of one package: deb with the distro and arch qualifiers scanners match advisories
    by, pypi under its normalized (PEP 503) name, and generic for what trainbase builds itself."""
    if pkg.kind == "deb":
        os_id = os_release.get("ID", "")
        if not os_id:
            raise ValueError(f"deb package {pkg.name} in an inventory without an os ID")
        qualifiers = {"distro": f"{os_id}-{os_release.get('VERSION_ID', '')}".rstrip("-")}
        if pkg.arch:
            qualifiers["arch"] = pkg.arch
        return PackageURL(type="deb", namespace=os_id, name=pkg.name, version=pkg.version, qualifiers=qualifiers)
    if pkg.kind == "pypi":
        return PackageURL(type="pypi", name=re.sub(r"[-_.]+", "-", pkg.name).lower(), version=pkg.version)
    return PackageURL(type="generic", name=pkg.name, version=pkg.version)


def _component(pkg: Package, os_release: dict[str, str]) -> Component:
    purl = package_url(pkg, os_release)
    properties = []
    external_references = []
    hashes = []
    if pkg.kind == "deb" and pkg.source:
        # Security trackers (Debian's, Ubuntu's) name the source package, not the binary one.
        properties.append(_prop("deb.source", pkg.source))
    if pkg.kind == "component" and urlparse(pkg.source).scheme in ("http", "https", "ftp"):
        external_references.append(ExternalReference(type=ExternalReferenceType.DISTRIBUTION, url=XsUri(pkg.source)))
    elif pkg.kind == "component" and pkg.source:
        properties.append(_prop("component.source", pkg.source))  # e.g. imagefs/: shipped from this repository
    if pkg.sha256:
        hashes.append(HashType(alg=HashAlgorithm.SHA_256, content=pkg.sha256))
    return Component(
        name=pkg.name,
        version=pkg.version,
        type=ComponentType.LIBRARY,
        purl=purl,
        bom_ref=purl.to_string(),
        properties=properties,
        external_references=external_references,
        hashes=hashes,
    )


def _flatten(prefix: str, value: Any) -> list[tuple[str, str]]:
    """Manifest facts as dotted names: components.cuda.toolkit=12.8.1, frameworks.pytorch=2.9.1.
    Nulls say "not applicable" and are left out; lists are joined in their given order."""
    if value is None:
        return []
    if isinstance(value, dict):
        return [pair for k in sorted(value) for pair in _flatten(f"{prefix}.{k}", value[k])]
    if isinstance(value, list):
        return [(prefix, ",".join(str(v) for v in value))]
    return [(prefix, str(value))]


def _image_component(inv: Inventory) -> Component:
    facts = [(f"base.{k}", v) for k, v in sorted(inv.base.items()) if v]
    facts += [(f"os.{k}", v) for k, v in sorted(inv.os.items()) if v]
    for section in ("components", "frameworks"):
        facts += _flatten(section, inv.manifest.get(section))
    return Component(
        name=inv.cell,
        version=inv.tag,
        type=ComponentType.CONTAINER,
        bom_ref=f"image:{inv.cell}@{inv.tag}",
        properties=[_prop(k, v) for k, v in facts],
    )


def serial_number(inv: Inventory) -> uuid.UUID:
    """A uuid5 over the cell, the tag and everything the inventory holds but the image id: the
    same content gives the same serial number, any other package or base a different one."""
    content = json.dumps(
        {k: v for k, v in inv.to_json().items() if k != "image_id"}, sort_keys=True, separators=(",", ":")
    )
    return uuid.uuid5(SERIAL_NAMESPACE, f"{inv.cell}\n{inv.tag}\n{hashlib.sha256(content.encode()).hexdigest()}")


def to_cyclonedx(inv: Inventory) -> str:
    """The image's SBOM as CycloneDX 1.6 JSON text, in canonical layout; byte-identical for an
    identical inventory."""
    components = [_component(p, inv.os) for p in sorted(set(inv.packages))]
    refs = [c.bom_ref.value for c in components]
    clashes = sorted({r for r in refs if refs.count(r) > 1}, key=str)
    if clashes:
        # The library would make them unique with random suffixes, and the SBOM would no longer reproduce.
        raise ValueError(f"{inv.cell}:{inv.tag}: packages that differ only where a purl cannot tell: {clashes}")
    bom = Bom(components=components, serial_number=serial_number(inv))
    image = _image_component(inv)
    bom.metadata.component = image
    # The library sets "now" when given no timestamp; None is how it leaves the field out (it is
    # optional in the schema), and a build time would make every SBOM of one image differ.
    bom.metadata.timestamp = None  # type: ignore[assignment]  # typed datetime; None is accepted (above)
    # The image holds every package; saying so completes the dependency graph the library checks.
    bom.register_dependency(image, components)
    return canonical(make_outputter(bom, OutputFormat.JSON, SPEC).output_as_string())


def validate(text: str) -> None:
    """Raise ValueError unless ``text`` is a valid CycloneDX 1.6 JSON document (strict schema:
    unknown fields are errors too)."""
    try:
        error = JsonStrictValidator(SPEC).validate_str(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not a CycloneDX document: not JSON ({e})") from e
    if error is not None:
        # error.data is jsonschema's error: its message and path, without the schema it quotes.
        raise ValueError(
            f"not a valid CycloneDX {SPEC.to_version()} document: {error.data.message} (at {error.data.json_path})"
        )


def canonical(text: str) -> str:
    """The one layout of an SBOM's JSON that digests are taken over: sorted keys, two-space
    indent, ASCII only (so the file's bytes do not depend on an encoding), a final newline.
    to_cyclonedx returns this form, so `sha256sum` of a written SBOM equals its sbom_digest."""
    return json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"


def sbom_digest(text: str) -> str:
    """sha256 hex of the canonical text: the same for a reformatted copy of the same document."""
    return hashlib.sha256(canonical(text).encode("ascii")).hexdigest()
