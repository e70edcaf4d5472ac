"""CUDA forward compatibility where the image carries it (issue 62): tb-doctor's gpu.forward_compat
says which way a node's driver runs the image's CUDA, and the image's start-up step
(imagefs/opt/trainbase/lib/cuda-compat.sh, sourced by env.sh) selects the compat libraries exactly
when NVIDIA's runtime would -- checked here on simulated drivers, without a GPU."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from trainbase_common.driver_promise import nvidia_require_cuda

from .conftest import ROOT
from .doctor_fakes import FakeCuda, FakeNode, result

LIB = ROOT / "imagefs" / "opt" / "trainbase" / "lib"
COMPAT = "/usr/local/cuda/compat"
SYSTEM = "/usr/lib/x86_64-linux-gnu"
UBUNTU = {"NVIDIA_REQUIRE_CUDA": nvidia_require_cuda("12.8.1"), "PATH": "/usr/bin:/bin"}
DEBIAN = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.8", "PATH": "/usr/bin:/bin"}
H100, RTX = "NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090"


def node(
    tmp_path: Path,
    driver: str,
    libcuda: str,
    env: dict = UBUNTU,
    compat: str | None = "570.124.06",
    model: str = H100,
    init_rc: int = 0,
    cuda: str = "12.8",
) -> FakeNode:
    """A node with driver ``driver`` and GPU ``model``, running an image of CUDA ``cuda`` that
    carries the compat libcuda ``compat`` (None: none), whose process loaded ``libcuda``."""
    code = int(cuda.split(".")[0]) * 1000 + int(cuda.split(".")[1]) * 10
    manifest = {"name": "cell", "schema": 1, "components": {"cuda": {"version": cuda}}}
    n = FakeNode(
        tmp_path, env=env, manifest=manifest, driver=driver, libs={"libcuda.so.1": (FakeCuda(init_rc, code), libcuda)}
    )
    if compat:
        n.write(f"{COMPAT}/libcuda.so.{compat}")
        n.write(f"{COMPAT}/libcuda.so.1")
    n.write("/proc/driver/nvidia/gpus/0000:18:00.0/information", f"Model: \t\t {model}\nIRQ: 42\n")
    return n


# ----------------------------------------------------------------------------- tb-doctor gpu.forward_compat
def test_an_older_data_center_driver_runs_through_the_compat_libraries(tmp_path):
    r = result(node(tmp_path, "535.183.01", f"{COMPAT}/libcuda.so.570.124.06"), "gpu.forward_compat")
    assert r.status == "ok" and r.facts["path"] == "forward-compat", r.summary
    assert (
        "driver 535.183.01 (R535, CUDA 12.2) is older than the image's CUDA 12.8: it runs through forward " in r.summary
    )
    assert r.facts["compat_branches"] == [470, 535, 550, 560, 565] and r.facts["runtime_admits"] is True


def test_the_compat_libraries_as_ldconfig_or_mount_put_them_are_recognised_by_their_version(tmp_path):
    """libnvidia-container's mount mode binds them over the driver's libcuda in the system directory."""
    r = result(node(tmp_path, "550.163.01", f"{SYSTEM}/libcuda.so.570.124.06"), "gpu.forward_compat")
    assert r.status == "ok" and r.facts["path"] == "forward-compat", r.summary


def test_an_older_driver_without_compat_libraries_runs_through_minor_version_compatibility_only(tmp_path):
    n = node(tmp_path, "535.183.01", f"{SYSTEM}/libcuda.so.535.183.01", env=DEBIAN, compat=None)
    r = result(n, "gpu.forward_compat")
    assert r.status == "warn" and r.facts["path"] == "minor-version", r.summary
    assert "this image carries no forward-compatibility libraries; the NVIDIA container runtime refuses" in r.summary
    assert "a driver for CUDA 12.8 (570.26 or newer)" in r.hint and r.facts["runtime_admits"] is False


def test_an_older_major_without_compat_libraries_fails(tmp_path):
    n = node(tmp_path, "550.163.01", f"{SYSTEM}/libcuda.so.550.163.01", DEBIAN, None, init_rc=35, cuda="13.0")
    r = result(n, "gpu.forward_compat")
    assert r.status == "fail" and "error 35" in r.summary, r.summary


def test_compat_libraries_of_the_drivers_own_branch_are_no_way_forward(tmp_path):
    """As found on an H200 host (R580, CUDA 13.0's compat libcuda 580.95.05) asked for CUDA 13.2:
    libnvidia-container leaves such a library out, and so does this check."""
    env = {"NVIDIA_REQUIRE_CUDA": nvidia_require_cuda("13.2.1")}
    n = node(tmp_path, "580.159.04", f"{SYSTEM}/libcuda.so.580.159.04", env, "580.95.05", cuda="13.2")
    r = result(n, "gpu.forward_compat")
    assert r.status == "warn" and r.facts["path"] == "minor-version", r.summary
    assert "the image's compat libcuda 580.95.05 is of R580, no newer than the driver's branch" in r.summary
    assert r.hint == "upgrade to a driver for CUDA 13.2 (595.45.04 or newer)"


def test_a_newer_driver_runs_natively_and_leaves_the_compat_libraries_alone(tmp_path):
    r = result(node(tmp_path, "580.95.05", f"{SYSTEM}/libcuda.so.580.95.05"), "gpu.forward_compat")
    assert r.status == "ok" and r.facts["path"] == "native", r.summary
    assert (
        "runs the image's CUDA 12.8 natively; the forward-compatibility libraries (libcuda 570.124.06) are not used"
        in r.summary
    )


def test_the_compat_libraries_forced_on_a_driver_that_does_not_need_them_fail(tmp_path):
    n = node(tmp_path, "580.95.05", f"{COMPAT}/libcuda.so.570.124.06", init_rc=803)
    r = result(n, "gpu.forward_compat")
    assert r.status == "fail" and "error 803" in r.summary and "TRAINBASE_CUDA_COMPAT=0" in r.hint, r.summary


def test_the_compat_libraries_the_driver_needs_but_the_process_did_not_load_fail_or_warn(tmp_path):
    r = result(node(tmp_path, "535.183.01", f"{SYSTEM}/libcuda.so.535.183.01"), "gpu.forward_compat")
    assert r.status == "warn" and r.facts["path"] == "minor-version", r.summary
    assert (
        f"needs the image's forward-compatibility libcuda 570.124.06 for CUDA 12.8, but this process loaded {SYSTEM}"
        in r.summary
    )
    assert "NVIDIA container runtime" in r.hint


def test_forward_compatibility_on_a_geforce_fails(tmp_path):
    n = node(tmp_path, "550.163.01", f"{COMPAT}/libcuda.so.570.124.06", model=RTX, init_rc=804)
    r = result(n, "gpu.forward_compat")
    assert r.status == "fail" and r.facts["path"] == "none", r.summary
    assert "forward compatibility does not run on NVIDIA GeForce RTX 4090" in r.summary
    assert "the NVIDIA container runtime refuses the image here" in r.summary and "error 804" in r.summary


def test_a_branch_the_compat_package_does_not_support_fails(tmp_path):
    r = result(node(tmp_path, "545.23.08", f"{SYSTEM}/libcuda.so.545.23.08"), "gpu.forward_compat")
    assert r.status == "fail" and "supports drivers of R470/R535/R550/R560/R565, not R545" in r.summary, r.summary


def test_no_gpu_skips_and_fails_where_one_is_expected(tmp_path):
    """Like every gpu check (the conformance suite's test_doctor_gpu_checks_are_honest holds them
    to it): no GPU is a skip, and a failure under --expect gpu."""
    assert result(FakeNode(tmp_path), "gpu.forward_compat").status == "skip"
    expected = result(FakeNode(tmp_path / "x", expect=("gpu",)), "gpu.forward_compat")
    assert expected.status == "fail" and "no GPU" in expected.summary


# ----------------------------------------------------------------------------- the start-up step
def start(
    tmp_path: Path, driver: str | None, *, model=H100, compat="570.124.06", branches="470 535 550 560 565", **env
):
    """LD_LIBRARY_PATH after a process sources cuda-compat.sh on a node with ``driver``."""
    root = Path(tempfile.mkdtemp(dir=tmp_path))  # a node of its own for each call
    if compat:
        (root / COMPAT.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (root / COMPAT.lstrip("/") / f"libcuda.so.{compat}").write_text("")
    if driver:
        info = root / "proc/driver/nvidia/gpus/0000:18:00.0/information"
        info.parent.mkdir(parents=True, exist_ok=True)
        info.write_text(f"Model: \t\t {model}\n")
        (root / "proc/driver/nvidia/version").write_text(
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {driver}  Release Build  (dvs-builder@U16)\n"
        )
    script = f"TB_CUDA_COMPAT_BRANCHES='{branches}'; . {LIB / 'cuda-compat.sh'}; printf %s \"$LD_LIBRARY_PATH\""
    base = {"PATH": os.environ["PATH"], "TRAINBASE_CUDA_COMPAT_ROOT": str(root)}
    r = subprocess.run(["sh", "-c", script], env={**base, **env}, capture_output=True, text=True, check=True)
    return r.stdout


@pytest.mark.parametrize(
    "driver, model, path",
    [
        ("535.183.01", H100, f"{COMPAT}:/usr/local/cuda/lib64"),  # older, supported branch, data-center GPU
        ("565.57.01", H100, f"{COMPAT}:/usr/local/cuda/lib64"),
        ("580.95.05", H100, "/usr/local/cuda/lib64"),  # newer: the driver's own libcuda
        ("570.86.15", H100, "/usr/local/cuda/lib64"),  # the compat library's own branch
        ("545.23.08", H100, "/usr/local/cuda/lib64"),  # a branch the compat package does not support
        ("535.183.01", RTX, "/usr/local/cuda/lib64"),  # a GeForce: no forward compatibility
        (None, H100, "/usr/local/cuda/lib64"),  # no driver here: nothing to decide
    ],
)
def test_the_start_up_step_selects_the_compat_libraries_exactly_when_the_driver_needs_them(
    tmp_path, driver, model, path
):
    assert start(tmp_path, driver, model=model, LD_LIBRARY_PATH="/usr/local/cuda/lib64") == path


def test_the_start_up_step_takes_them_off_a_newer_drivers_path_and_keeps_the_rest(tmp_path):
    before = f"/opt/x:{COMPAT}:/usr/local/cuda/lib64"
    assert start(tmp_path, "580.95.05", LD_LIBRARY_PATH=before) == "/opt/x:/usr/local/cuda/lib64"
    assert start(tmp_path, "535.183.01", LD_LIBRARY_PATH=before) == before  # already there: not twice
    assert start(tmp_path, "535.183.01") == COMPAT  # no LD_LIBRARY_PATH before


def test_the_start_up_step_obeys_the_override_and_needs_the_libraries(tmp_path):
    assert start(tmp_path, "535.183.01", TRAINBASE_CUDA_COMPAT="0", LD_LIBRARY_PATH="/a") == "/a"
    assert start(tmp_path, "580.95.05", TRAINBASE_CUDA_COMPAT="1", LD_LIBRARY_PATH="/a") == f"{COMPAT}:/a"
    assert start(tmp_path, "535.183.01", compat=None, LD_LIBRARY_PATH="/a") == "/a"  # a Debian row: none


def test_tb_entrypoints_makes_env_sh_select_them_in_an_image_that_carries_them(tmp_path, monkeypatch):
    loader = importlib.machinery.SourceFileLoader("tb_entrypoints", str(LIB / "tb-entrypoints"))
    spec = importlib.util.spec_from_loader("tb_entrypoints", loader)
    assert spec is not None
    tool = importlib.util.module_from_spec(spec)
    loader.exec_module(tool)
    compat = tmp_path / "compat"
    compat.mkdir()
    (compat / "libcuda.so.570.124.06").write_text("")
    monkeypatch.setattr(tool, "ENV_SH", tmp_path / "env.sh")
    monkeypatch.setattr(tool, "BIN", tmp_path / "bin")
    monkeypatch.setattr(tool, "COMPAT_DIR", compat)
    (tmp_path / "bin").mkdir()
    monkeypatch.setattr(os, "environ", {"PATH": "/usr/bin:/bin", **UBUNTU, "LD_LIBRARY_PATH": "/usr/local/cuda/lib64"})
    assert tool.main() == 0
    text = (tmp_path / "env.sh").read_text()
    assert "TB_CUDA_COMPAT_BRANCHES='470 535 550 560 565'\n" in text
    assert text.rstrip().endswith(f". {LIB / 'cuda-compat.sh'}")
    compat.joinpath("libcuda.so.570.124.06").unlink()  # a Debian row's image: no such lines
    assert tool.main() == 0 and "cuda-compat" not in (tmp_path / "env.sh").read_text()
