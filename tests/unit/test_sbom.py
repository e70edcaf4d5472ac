"""SBOM: valid CycloneDX 1.6, reproducible to the byte, purls scanners can match, and a digest
that moves with what the image has."""

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from trainbase.supply import sbom
from trainbase.supply.inventory import Inventory, Package

FIXTURE = Path(__file__).parent / "fixtures" / "supply" / "inventory.json"


@pytest.fixture
def inv() -> Inventory:
    return Inventory.from_json(json.loads(FIXTURE.read_text()))


def _components(text: str) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(text)["components"]}


def _props(component: dict) -> dict[str, str]:
    return {p["name"]: p["value"] for p in component.get("properties", [])}


def _with_version(inv: Inventory, name: str, version: str) -> Inventory:
    packages = tuple(dataclasses.replace(p, version=version) if p.name == name else p for p in inv.packages)
    assert packages != inv.packages, f"no package {name} in the fixture"
    return dataclasses.replace(inv, packages=packages)


def test_the_sbom_is_valid_cyclonedx_1_6(inv):
    text = sbom.to_cyclonedx(inv)
    sbom.validate(text)
    doc = json.loads(text)
    assert (doc["bomFormat"], doc["specVersion"]) == ("CycloneDX", "1.6")
    assert len(doc["components"]) == len(inv.packages)


def test_byte_identical_across_calls_and_an_inventory_json_round_trip(inv):
    first = sbom.to_cyclonedx(inv)
    assert sbom.to_cyclonedx(inv) == first
    again = Inventory.from_json(json.loads(json.dumps(inv.to_json())))
    assert sbom.to_cyclonedx(again) == first
    shuffled = dataclasses.replace(inv, packages=tuple(reversed(inv.packages)))
    assert sbom.to_cyclonedx(shuffled) == first


def test_no_timestamp_and_a_serial_number_from_the_content(inv):
    doc = json.loads(sbom.to_cyclonedx(inv))
    assert "timestamp" not in doc["metadata"]
    assert doc["serialNumber"] == f"urn:uuid:{sbom.serial_number(inv)}"
    other = json.loads(sbom.to_cyclonedx(_with_version(inv, "torch", "2.9.2")))
    assert other["serialNumber"] != doc["serialNumber"]


def test_deb_purl_carries_namespace_arch_and_distro(inv):
    libnccl = _components(sbom.to_cyclonedx(inv))["libnccl2"]
    assert libnccl["purl"] == "pkg:deb/debian/libnccl2@2.27.5-1%2Bcuda12.8?arch=amd64&distro=debian-12"
    assert libnccl["bom-ref"] == libnccl["purl"]
    assert _props(libnccl)["trainbase:deb.source"] == "nccl"


def test_deb_purl_of_ubuntu():
    pkg = Package("deb", "libc6", "2.39-0ubuntu8.4", arch="arm64", source="glibc")
    purl = sbom.package_url(pkg, {"ID": "ubuntu", "VERSION_ID": "24.04"})
    assert purl.to_string() == "pkg:deb/ubuntu/libc6@2.39-0ubuntu8.4?arch=arm64&distro=ubuntu-24.04"


def test_deb_without_an_os_id_is_refused():
    with pytest.raises(ValueError, match="os ID"):
        sbom.package_url(Package("deb", "libc6", "2.36-9", arch="amd64"), {})


def test_pypi_purl_uses_the_normalized_name(inv):
    components = _components(sbom.to_cyclonedx(inv))
    assert components["typing_extensions"]["purl"] == "pkg:pypi/typing-extensions@4.15.0"
    assert components["torch"]["purl"] == "pkg:pypi/torch@2.9.1"


def test_component_has_generic_purl_distribution_url_and_sha256(inv):
    openmpi = _components(sbom.to_cyclonedx(inv))["openmpi"]
    assert openmpi["purl"] == "pkg:generic/openmpi@4.1.4"
    assert openmpi["externalReferences"] == [
        {"type": "distribution", "url": "http://deb.debian.org/debian/pool/main/o/openmpi/openmpi_4.1.4.orig.tar.xz"}
    ]
    assert openmpi["hashes"] == [
        {"alg": "SHA-256", "content": "ddaee7dbdb01eb4fab1fda5b5e03e8bbff026711806c095c1f39bb410f99f263"}
    ]


def test_component_shipped_from_the_repository_has_no_url_and_no_hash(inv):
    tools = _components(sbom.to_cyclonedx(inv))["trainbase-tools"]
    assert "externalReferences" not in tools and "hashes" not in tools
    assert _props(tools) == {"trainbase:component.source": "imagefs/"}


def test_metadata_component_is_the_image_with_its_manifest_facts(inv):
    image = json.loads(sbom.to_cyclonedx(inv))["metadata"]["component"]
    assert (image["type"], image["name"], image["version"]) == ("container", inv.cell, inv.tag)
    props = _props(image)
    assert "trainbase:image_id" not in props  # the build report's: it moves with mtimes and the SBOM layer
    assert props["trainbase:base.ref"] == "debian:12.15-slim"
    assert props["trainbase:base.identity"] == inv.base["identity"]
    assert props["trainbase:frameworks.pytorch"] == "2.9.1"
    assert props["trainbase:components.cuda.version"] == "12.8"
    assert props["trainbase:components.nccl.version"] == "2.27.5"
    assert props["trainbase:components.ib.providers"] == "mlx5,mlx4,rxe,efa"
    assert "trainbase:components.ib.version" not in props  # null in the manifest: not applicable


def test_the_image_depends_on_every_package(inv):
    doc = json.loads(sbom.to_cyclonedx(inv))
    image_ref = doc["metadata"]["component"]["bom-ref"]
    (image_deps,) = [d["dependsOn"] for d in doc["dependencies"] if d["ref"] == image_ref]
    assert sorted(image_deps) == sorted(c["bom-ref"] for c in doc["components"])


def test_a_changed_package_version_changes_the_digest(inv):
    text = sbom.to_cyclonedx(inv)
    assert sbom.sbom_digest(text) != sbom.sbom_digest(sbom.to_cyclonedx(_with_version(inv, "libc6", "2.36-9+deb12u11")))


def test_the_digest_ignores_formatting_and_is_the_written_files_sha256(inv):
    text = sbom.to_cyclonedx(inv)
    assert sbom.sbom_digest(json.dumps(json.loads(text))) == sbom.sbom_digest(text)
    assert sbom.sbom_digest(text) == hashlib.sha256(text.encode()).hexdigest()


def test_packages_a_purl_cannot_tell_apart_are_refused(inv):
    twin = Package("pypi", "Typing-Extensions", "4.15.0")  # normalizes like typing_extensions
    with pytest.raises(ValueError, match="typing-extensions"):
        sbom.to_cyclonedx(dataclasses.replace(inv, packages=inv.packages + (twin,)))


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: d.pop("bomFormat"),
        lambda d: d["components"][0].update(type="not-a-type"),
        lambda d: d.update(unexpected=True),
    ],
    ids=["no bomFormat", "bad component type", "unknown field"],
)
def test_validate_rejects_a_broken_document(inv, breakage):
    doc = json.loads(sbom.to_cyclonedx(inv))
    breakage(doc)
    with pytest.raises(ValueError, match="not a valid CycloneDX 1.6 document"):
        sbom.validate(json.dumps(doc))


def test_validate_rejects_text_that_is_not_json():
    with pytest.raises(ValueError, match="not JSON"):
        sbom.validate("{components: []")


def test_another_image_id_alone_gives_the_same_sbom(inv):
    """What `build.py --locked` compares: a rebuild with the same packages but other layer bytes."""
    import dataclasses

    assert sbom.to_cyclonedx(dataclasses.replace(inv, image_id="sha256:" + "e" * 64)) == sbom.to_cyclonedx(inv)
