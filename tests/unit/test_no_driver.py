"""tb-no-driver (issue 71): no NVIDIA driver userspace in any image. A libnvidia-compute-* package
(NVIDIA's ucx-cuda debs hard-depended on one, openucx/ucx#11140) or a libcuda.so.1 on the
loader's path shadows the driver the node's runtime mounts: CUDA error 803 on the node. Run on
fake roots made here, and over every rendered recipe."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import ROOT

TOOL = ROOT / "imagefs" / "usr" / "local" / "bin" / "tb-no-driver"
pytestmark = pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs dpkg-query (a Debian host)")


def fake_root(tmp_path: Path, packages: list[str] = (), files: list[str] = ()) -> Path:
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    status = "".join(
        f"Package: {p}\nStatus: install ok installed\nVersion: 1.0\nArchitecture: amd64\nMaintainer: x\nDescription: x\n\n"
        for p in packages
    )
    (root / "var/lib/dpkg/status").write_text(status)
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_bytes(b"\x7fELF")
    return root


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TB_NO_DRIVER_ROOT": str(root)}
    return subprocess.run(["sh", str(TOOL), *args], env=env, capture_output=True, text=True, check=False)


def test_a_clean_image_passes_with_compat_and_stubs(tmp_path):
    root = fake_root(
        tmp_path,
        packages=["cuda-compat-13-2", "libibverbs1", "nvidia-cuda-runtime-meta"],
        files=["usr/local/cuda-13.2/compat/libcuda.so.1", "usr/local/cuda/lib64/stubs/libcuda.so"],
    )
    r = run(root)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("package", ["libnvidia-compute-580", "libcuda1", "nvidia-utils-570", "cuda-drivers"])
def test_a_driver_package_fails_naming_it(tmp_path, package):
    r = run(fake_root(tmp_path, packages=["libibverbs1", package]))
    assert r.returncode == 1 and f"package {package}" in r.stderr and "803" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "path", ["usr/lib/x86_64-linux-gnu/libcuda.so.1", "opt/x/libcuda.so.580.95.05", "usr/lib64/libnvidia-ml.so.1"]
)
def test_a_driver_library_outside_compat_fails_naming_it(tmp_path, path):
    r = run(fake_root(tmp_path, files=[path]))
    assert r.returncode == 1 and f"file /{path}" in r.stderr, r.stderr


def test_the_apt_pin_refuses_driver_packages_and_nothing_else(tmp_path):
    root = fake_root(tmp_path)
    assert run(root, "--pin").returncode == 0
    prefs = root / "etc/apt/preferences.d"
    text = (prefs / "trainbase-no-driver").read_text()
    assert "Pin-Priority: -1" in text and "libnvidia-compute*" in text
    if shutil.which("apt-cache") is None:
        pytest.skip("no apt-cache on this host")
    # apt's own reading of the file: a driver package installed (a fake dpkg status) gets -1, curl keeps its priority
    status = fake_root(tmp_path / "s", packages=["libnvidia-compute-580", "curl"]) / "var/lib/dpkg/status"
    out = subprocess.run(
        [
            "apt-cache",
            "-o",
            f"Dir::Etc::PreferencesParts={prefs}",
            "-o",
            f"Dir::State::status={status}",
            "policy",
            "libnvidia-compute-580",
            "curl",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    driver, _, curl = out.partition("curl:")
    assert " -1" in driver and " -1" not in curl, out


def test_every_recipe_pins_apt_and_checks_the_finished_image():
    for d in sorted((ROOT / "images").iterdir()):
        text = (d / "Dockerfile").read_text()
        last = text[text.rindex("\nFROM ") :]
        assert "\n && tb-no-driver\n" in last, f"{d.name}: the shipped stage does not run tb-no-driver"
        for stage in text.split("\nFROM ")[1:]:
            if "apt-get install" in stage and stage.split()[0].startswith(
                ("${TRAINBASE_BASE}", "nvidia/", "debian:", "trainbase-bootstrap")
            ):
                assert "tb-no-driver --pin" in stage, (
                    f"{d.name}: a stage FROM {stage.split()[0]} installs with apt unpinned"
                )
