"""Release notes: Debian's version ordering against known pairs, package and component changes
between two small synthetic inventories, security entries, and a golden document.

Update the golden file after an intended layout change with
    TRAINBASE_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_release_notes.py
"""

import dataclasses
import os
from pathlib import Path

import pytest

from trainbase.supply.inventory import Inventory, Package
from trainbase.supply.release_notes import compare_deb_versions, compare_versions, package_changes, release_notes

GOLDEN = Path(__file__).parent / "fixtures" / "supply" / "release-notes.md"


def inventory(
    tag: str,
    packages: list[Package],
    *,
    nccl: str = "2.27.5",
    cuda_from: str = "wheels",
    frameworks: dict[str, str] | None = None,
) -> Inventory:
    manifest = {
        "components": {
            "cuda": {"from": cuda_from, "toolkit": "12.8.1", "version": "12.8"},
            "cudnn": {"version": "9.10.2.21"},
            "nccl": {"from": "wheel", "version": nccl},
            "mpi": {"kind": "openmpi", "version": "4.1.4"},
            "ucx": {"from": "distro", "version": "1.13.1"},
            "python": {"manager": "venv", "version": "3.11"},
            "os": {"base": "debian:12.15-slim"},
        },
        "frameworks": frameworks or {},
    }
    return Inventory(
        cell="openmpi4.1.4-cuda12.8-cudnn9-debian12",
        tag=tag,
        image_id=f"sha256:{tag[1:] * 4}",
        os={"ID": "debian", "VERSION_ID": "12"},
        base={"ref": "debian:12.15-slim"},
        packages=tuple(packages),
        manifest=manifest,
    )


def deb(name: str, version: str, arch: str = "amd64", source: str = "") -> Package:
    return Package("deb", name, version, arch=arch, source=source or name)


PREVIOUS = inventory(
    "r111111111111",
    [
        deb("libc6", "2.36-9+deb12u9", source="glibc"),
        deb("libnccl2", "2.27.7-1+cuda12.9"),
        deb("libgomp1", "12.2.0-14"),
        deb("libzstd1", "1.5.4+dfsg2-5", arch="i386"),
        Package("pypi", "PyYAML", "6.0.2"),
        Package("pypi", "torch", "2.9.0"),
        Package("pypi", "six", "1.17.0"),
        Package("component", "openmpi", "4.1.4", source="http://deb.debian.org/openmpi_4.1.4.orig.tar.xz"),
        Package("component", "trainbase-tools", "0a1b2c3d4e5f", source="imagefs/"),
    ],
    nccl="2.27.7",
    frameworks={"pytorch": "2.9.0"},
)
CURRENT = inventory(
    "r222222222222",
    [
        deb("libc6", "2.36-9+deb12u10", source="glibc"),
        deb("libnccl2", "2.27.5-1+cuda12.8"),
        deb("libgomp1", "12.2.0-14"),
        deb("libzstd1", "1.5.4+dfsg2-5", arch="i386"),
        deb("libzstd1", "1.5.4+dfsg2-5", arch="amd64"),
        Package("pypi", "pyyaml", "6.0.3"),
        Package("pypi", "torch", "2.9.1"),
        Package("pypi", "mpi4py", "4.1.1"),
        Package("component", "openmpi", "4.1.4", source="http://deb.debian.org/openmpi_4.1.4.orig.tar.xz"),
        Package("component", "trainbase-tools", "9f8e7d6c5b4a", source="imagefs/"),
    ],
    frameworks={"pytorch": "2.9.1"},
)
SECURITY = [
    {"package": "torch", "installed": "2.9.0", "fixed": "2.9.1", "advisory": "GHSA-aaaa-bbbb-cccc"},
    {"package": "glibc", "installed": "2.36-9+deb12u9", "fixed": "2.36-9+deb12u10", "advisory": "DSA-5678-1"},
    {"package": "libgomp1", "installed": "12.2.0-14", "fixed": "12.2.0-14+deb12u1", "advisory": "CVE-2026-0001"},
]


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ("1.2~rc1", "1.2", -1),  # ~ sorts before the end of the string
        ("1.0~~", "1.0~~a", -1),  # Policy's own example: ~~ < ~~a < ~ < "" < a
        ("1.0~~a", "1.0~", -1),
        ("1.0~", "1.0", -1),
        ("1.0", "1.0a", -1),
        ("1:1.0", "2.0", 1),  # the epoch wins
        ("0:1.0", "1.0", 0),  # no epoch is epoch 0
        ("2.27.5-1+cuda12.8", "2.27.7-1+cuda12.9", -1),
        ("2.27.5-1+cuda12.8", "2.27.5-1+cuda12.9", -1),  # same upstream, the revision decides
        ("2.36-9+deb12u10", "2.36-9+deb12u9", 1),  # digits compare as numbers, not text
        ("1.0a", "1.0+", -1),  # letters before other characters
        ("1.0+dfsg-1", "1.0-1", 1),
        ("1.0", "1.0.1", -1),
        ("1.0", "1.0-0", 0),  # no revision compares like revision 0
        ("1.2-3-4", "1.2-3-5", -1),  # the revision follows the last hyphen
        ("007", "7", 0),
    ],
)
def test_debian_version_order(a, b, expected):
    assert compare_deb_versions(a, b) == expected
    assert compare_deb_versions(b, a) == -expected


def test_a_debian_version_with_a_bad_epoch_is_refused():
    with pytest.raises(ValueError, match="epoch"):
        compare_deb_versions("a:1.0", "1.0")


def test_python_versions_order_by_pep_440_and_digests_not_at_all():
    assert compare_versions("pypi", "2.9.0rc1", "2.9.0") == -1  # Debian's rules would say the opposite
    assert compare_versions("pypi", "2.9.1+cu128", "2.9.1") == 1
    assert compare_versions("pypi", "not a version", "1.0") is None
    assert compare_versions("component", "0a1b2c3d4e5f", "9f8e7d6c5b4a") is None
    assert compare_versions("component", "1.20.1~rc1", "1.20.1") == -1


def test_package_changes_per_kind():
    debs = package_changes(CURRENT, PREVIOUS, "deb")
    assert debs.upgraded == [("libc6", "2.36-9+deb12u9", "2.36-9+deb12u10")]
    assert debs.downgraded == [("libnccl2", "2.27.7-1+cuda12.9", "2.27.5-1+cuda12.8")]
    assert debs.added == [("libzstd1:amd64", "", "1.5.4+dfsg2-5")]  # a second architecture of one name
    assert debs.removed == [] and debs.changed == []
    pypi = package_changes(CURRENT, PREVIOUS, "pypi")
    assert pypi.upgraded == [("pyyaml", "6.0.2", "6.0.3"), ("torch", "2.9.0", "2.9.1")]  # PyYAML is pyyaml
    assert pypi.added == [("mpi4py", "", "4.1.1")]
    assert pypi.removed == [("six", "1.17.0", "")]
    components = package_changes(CURRENT, PREVIOUS, "component")
    assert components.changed == [("trainbase-tools", "0a1b2c3d4e5f", "9f8e7d6c5b4a")]
    assert not (components.added or components.removed or components.upgraded or components.downgraded)


def test_release_notes_against_the_previous_build():
    text = release_notes(CURRENT, PREVIOUS, SECURITY)
    assert text.startswith(f"# {CURRENT.cell} r222222222222 (previous: r111111111111)\n")
    assert "| NCCL | 2.27.7 (wheel) | 2.27.5 (wheel) |" in text
    assert "| pytorch | 2.9.0 | 2.9.1 |" in text
    assert "| CUDA |" not in text and "| MPI |" not in text  # unchanged components are left out
    assert "- libnccl2: 2.27.7-1+cuda12.9 → 2.27.5-1+cuda12.8" in text.split("Downgraded (1):")[1]
    assert "First build" not in text


def test_a_changed_origin_is_a_changed_component():
    text = release_notes(inventory("r3", [], cuda_from="base"), inventory("r2", []))
    assert "| CUDA | 12.8.1 (wheels) | 12.8.1 (base) |" in text


def test_nothing_changed():
    text = release_notes(CURRENT, CURRENT)
    assert "No component changed version." in text
    assert text.count("No change.") == 3


def test_first_build_has_the_full_component_table():
    text = release_notes(CURRENT, None)
    assert "First build of this cell." in text and "previous" not in text
    for row in (
        "| Base image | debian:12.15-slim |",
        "| CUDA | 12.8.1 (wheels) |",
        "| cuDNN | 9.10.2.21 |",
        "| NCCL | 2.27.5 (wheel) |",
        "| MPI | openmpi 4.1.4 |",
        "| UCX | 1.13.1 (distro) |",
        "| Python | 3.11 (venv) |",
        "| pytorch | 2.9.1 |",
    ):
        assert row in text
    assert "- Debian packages: 5" in text and "- Python distributions: 3" in text


def test_security_entries_are_split_into_fixed_and_still_open():
    text = release_notes(CURRENT, PREVIOUS, SECURITY)
    fixed, still_open = text.split("## Security fixes")[1].split("Still open in this build:")
    assert "| DSA-5678-1 | glibc |" in fixed and "| GHSA-aaaa-bbbb-cccc | torch |" in fixed  # glibc: libc6's source
    assert fixed.index("DSA-5678-1") < fixed.index("GHSA-aaaa")  # sorted
    assert "| CVE-2026-0001 | libgomp1 | 12.2.0-14 | 12.2.0-14+deb12u1 |" in still_open


def test_security_section_without_an_audit_and_with_nothing_found():
    assert "Security" not in release_notes(CURRENT, PREVIOUS, None)
    assert "## Security fixes\n\nNone.\n" in release_notes(CURRENT, PREVIOUS, [])


def test_a_pipe_in_an_advisory_does_not_break_the_table():
    entry = {"package": "six", "installed": "1.17.0", "fixed": "", "advisory": "a | b"}
    assert "| a \\| b | six |" in release_notes(CURRENT, PREVIOUS, [entry])


def test_deterministic_whatever_the_input_order():
    shuffled = dataclasses.replace(CURRENT, packages=tuple(reversed(CURRENT.packages)))
    assert release_notes(shuffled, PREVIOUS, SECURITY[::-1]) == release_notes(CURRENT, PREVIOUS, SECURITY)


def test_golden_document():
    text = release_notes(CURRENT, PREVIOUS, SECURITY)
    if os.environ.get("TRAINBASE_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), f"no golden file: run with TRAINBASE_UPDATE_GOLDEN=1 to create {GOLDEN.name}"
    assert text == GOLDEN.read_text()
