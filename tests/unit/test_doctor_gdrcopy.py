"""tb-doctor's gpu.gdrcopy: the image's libgdrapi needs the node's gdrdrv module and its
/dev/gdrdrv in the container; the doctor says which half is missing, and what to do."""

from __future__ import annotations

import pytest

from .doctor_fakes import MANIFEST, FakeCuda, FakeNode, core, result

WITH_GDRCOPY = {**MANIFEST, "components": {**MANIFEST["components"], "gdrcopy": {"version": "2.6"}}}


def node(tmp_path, *, manifest=WITH_GDRCOPY, gpus=1, module=None, device=False, expect=()) -> FakeNode:
    libs = {"libcuda.so.1": (FakeCuda(gpus=gpus), "/usr/lib/libcuda.so.1")} if gpus else {}
    n = FakeNode(tmp_path, manifest=manifest, libs=libs, expect=expect)
    if module == "sysfs":
        n.write("/sys/module/gdrdrv/version", "2.6")
    elif module == "proc":
        n.write(
            "/proc/modules", "nvidia_uvm 1 0 - Live 0x0\ngdrdrv 24576 0 - Live 0x0\nnvidia 2 1 nvidia_uvm, Live 0x0\n"
        )
    if device:
        n.write("/dev/gdrdrv")
    return n


def test_module_and_device_here_is_ok_naming_the_library(tmp_path):
    r = result(node(tmp_path, module="sysfs", device=True), "gpu.gdrcopy")
    assert r.status == core.OK and "libgdrapi 2.6" in r.summary
    assert r.facts == {"library": "2.6", "gdrdrv_loaded": True, "device": True}


@pytest.mark.parametrize("where", ["sysfs", "proc"])
def test_a_loaded_module_without_its_device_in_the_container_warns_to_pass_it(tmp_path, where):
    r = result(node(tmp_path, module=where), "gpu.gdrcopy")
    assert r.status == core.WARN and "/dev/gdrdrv is not in this container" in r.summary
    assert "--device=/dev/gdrdrv" in r.hint


def test_a_node_without_gdrdrv_warns_with_the_fix_never_fails(tmp_path):
    r = result(node(tmp_path), "gpu.gdrcopy")
    assert r.status == core.WARN and "does not load gdrdrv" in r.summary
    assert "gdrdrv-dkms" in r.hint and "--device=/dev/gdrdrv" in r.hint


def test_not_applicable_without_a_gpu_or_without_the_library(tmp_path):
    assert result(node(tmp_path / "a", gpus=0), "gpu.gdrcopy").status == core.SKIP
    assert result(node(tmp_path / "b", gpus=0, expect=("gpu",)), "gpu.gdrcopy").status == core.FAIL
    r = result(node(tmp_path / "c", manifest=MANIFEST, module="sysfs", device=True), "gpu.gdrcopy")
    assert r.status == core.SKIP and "carries no GDRCopy library" in r.summary
