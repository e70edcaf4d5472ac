"""Issue 62: the GPUs of 2026. What each CUDA row compiles for, the TORCH_CUDA_ARCH_LIST an image
bakes in (every extension a user builds later inherits it) against its manifest, and the static
check that reads it from a built image (test_gpu_paths.py::test_torch_cuda_arch_list_is_the_declared_gpus)."""

from __future__ import annotations

import json
import re

import pytest

from trainbase.define.matrix import load
from trainbase_conformance.checks import test_gpu_paths as gp

from .conftest import ROOT


def test_each_cuda_row_compiles_for_the_gpus_clusters_run_with_ptx_for_the_newest():
    m = load(ROOT / "matrix.yaml")
    for key, row in m.spec.cuda.items():
        archs = list(row.architectures)
        assert archs == sorted(archs, key=lambda a: tuple(map(int, a.split(".")))), f"cuda.{key}: oldest first"
        major, minor = map(int, key.split("."))
        # A100, A10/A40, L40S, H100/H200: each its own code on every row; B200/GB200 and RTX PRO 6000
        # Blackwell (10.0, 12.0) wherever the row's nvcc can target them (12.8+: an older row,
        # a CUDA version added for older fleets, reaches them through its newest code's PTX)
        blackwell = (major, minor) >= (12, 8)
        want = {"8.0", "8.6", "8.9", "9.0"} | ({"10.0", "12.0"} if blackwell else set())
        assert want <= set(archs), f"cuda.{key}: {archs}"
        assert archs[-1] == ("12.0" if blackwell else "9.0"), f"cuda.{key}: PTX goes with the newest GPU, {archs[-1]}"
        # B300/GB300 (sm_103) needs nvcc >= 12.9; on 12.8 it runs 10.0's code (same major)
        assert ("10.3" in archs) == ((major, minor) >= (12, 9)), f"cuda.{key}: {archs}"


def test_every_baked_arch_list_is_its_manifests_gpus():
    """Each rendered image that sets ENV TORCH_CUDA_ARCH_LIST sets its manifest's architectures,
    and only an image that keeps nvcc sets one."""
    seen = 0
    for dockerfile in sorted((ROOT / "images").glob("*/Dockerfile")):
        manifest = json.loads((dockerfile.parent / "manifest.json").read_text())
        envs = [
            m.group(1)
            for m in re.finditer(r'^ENV .*TORCH_CUDA_ARCH_LIST="([^"]*)"', dockerfile.read_text(), flags=re.M)
        ]
        comp = manifest.get("cuda_compiler")
        value = envs[-1] if envs else None
        if value is None and comp and comp["kept"]:
            # kept nvcc's list may come from the parent image's ENV: the nearest one that sets it
            parent = manifest["parent"]
            while parent and value is None:
                text = (ROOT / "images" / parent / "Dockerfile").read_text()
                found = re.findall(r'^ENV .*TORCH_CUDA_ARCH_LIST="([^"]*)"', text, flags=re.M)
                value = found[-1] if found else None
                parent = json.loads((ROOT / "images" / parent / "manifest.json").read_text())["parent"]
        assert gp.arch_list_env_problem(value, comp) is None, dockerfile.parent.name
        seen += value is not None
    assert seen, "no image bakes a TORCH_CUDA_ARCH_LIST (DeepSpeed's keep nvcc)"


COMP = {"kept": True, "architectures": ["8.0", "8.6", "8.9", "9.0", "10.0", "10.3", "12.0"]}


@pytest.mark.parametrize(
    ("value", "comp", "problem"),
    [
        ("8.0 8.9 9.0 10.0+PTX", COMP, "TORCH_CUDA_ARCH_LIST is '8.0 8.9 9.0 10.0+PTX', the manifest's GPUs are"),
        (None, COMP, "TORCH_CUDA_ARCH_LIST is None, the manifest's GPUs are"),
        ("9.0", {"kept": False, "architectures": ["9.0"]}, "is set, but the image keeps no CUDA compiler"),
        ("9.0", None, "is set, but the image keeps no CUDA compiler"),
    ],
)
def test_the_check_fails_on_an_arch_list_that_is_not_the_manifests(value, comp, problem):
    got = gp.arch_list_env_problem(value, comp)
    assert got is not None and problem in got


def test_the_check_passes_on_the_declared_list_and_on_none_without_nvcc():
    assert gp.arch_list_env_problem("8.0 8.6 8.9 9.0 10.0 10.3 12.0+PTX", COMP) is None
    assert gp.arch_list_env_problem(None, None) is None
    assert gp.arch_list_env_problem(None, {"kept": False, "architectures": ["9.0"]}) is None
    assert gp.torch_arch_list(["9.0", "10.0"]) == "9.0 10.0+PTX"


class _Target:
    def __init__(self, env: str, manifest: dict):
        self.env, self.manifest = env, manifest

    def sh(self, cmd: str, timeout: int = 60):
        class R:
            stdout = self.env

        return R()


def test_the_static_check_reads_the_images_environment():
    target = _Target("8.0 8.9 9.0 10.0+PTX\n", {"cuda_compiler": COMP})
    with pytest.raises(AssertionError, match="the manifest's GPUs are '8.0 8.6 8.9 9.0 10.0 10.3 12.0\\+PTX'"):
        gp.test_torch_cuda_arch_list_is_the_declared_gpus(target)
    gp.test_torch_cuda_arch_list_is_the_declared_gpus(_Target("\n", {}))


# ----------------------------------------------------------------------- tools run at run time


def test_every_framework_image_declares_the_tools_it_executes_on_a_gpu_node():
    seen = set()
    for path in sorted((ROOT / "images").glob("*/manifest.json")):
        m = json.loads(path.read_text())
        tools = m.get("runtime_tools") or []
        fws = m.get("frameworks") or {}
        assert ("triton.ptxas" in tools) == ("pytorch" in fws), path.parent.name
        if "tensorflow" in fws:
            assert "xla.ptxas" in tools, path.parent.name
        assert ({"nvcc", "ninja"} <= set(tools)) == bool((m.get("cuda_compiler") or {}).get("kept")), path.parent.name
        seen |= set(tools)
    assert seen == {"triton.ptxas", "xla.ptxas", "nvcc", "ninja"}, seen


def test_the_tools_check_names_each_missing_or_broken_tool():
    results = {
        "triton.ptxas": {
            "ok": False,
            "path": "/x/triton/backends/nvidia/bin/ptxas",
            "detail": "not found or not executable: /x/triton/backends/nvidia/bin/ptxas",
        },
        "nvcc": {"ok": True, "path": "/usr/local/cuda/bin/nvcc", "detail": "compiled a kernel for sm_80"},
    }
    assert gp.runtime_tool_problems(["triton.ptxas", "nvcc", "ninja"], results) == [
        "triton.ptxas: not found or not executable: /x/triton/backends/nvidia/bin/ptxas",
        "ninja: not tried",
    ]
    assert gp.runtime_tool_problems(["nvcc"], results) == []


class _ProbeTarget:
    name = "pytorch-image"
    python = "python3"

    def __init__(self, manifest: dict, results: dict):
        self.manifest, self.results, self.asked = manifest, results, []

    def json_probe(self, cmd: str, timeout: int = 120) -> dict:
        self.asked.append(cmd)
        return self.results


def test_the_static_check_fails_on_an_image_whose_triton_lost_its_ptxas():
    t = _ProbeTarget(
        {"runtime_tools": ["triton.ptxas"]},
        {
            "triton.ptxas": {
                "ok": False,
                "detail": "not found or not executable: /opt/venv/triton/backends/nvidia/bin/ptxas",
            }
        },
    )
    with pytest.raises(AssertionError, match="triton.ptxas: not found or not executable"):
        gp.test_runtime_tools_run(t)
    assert t.asked and t.asked[0].endswith("runtime_tools.py triton.ptxas")


def test_the_probe_finds_nothing_it_does_not_know_and_runs_what_it_finds(tmp_path, monkeypatch):
    import importlib.util as u

    spec = u.spec_from_file_location(
        "runtime_tools_probe", ROOT / "trainbase_conformance" / "probes" / "runtime_tools.py"
    )
    probe = u.module_from_spec(spec)
    spec.loader.exec_module(probe)
    assert probe.check("gcc")["detail"].startswith("unknown tool 'gcc'")
    monkeypatch.setattr(probe, "_package_dir", lambda name: None)
    assert probe.check("triton.ptxas") == {
        "ok": False,
        "path": None,
        "detail": "not found or not executable: no such package or command",
    }
    # a ptxas stand-in that answers its version but cannot assemble: the check says so
    fake = tmp_path / "ptxas"
    fake.write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && echo 'Cuda compilation tools, release 12.8' && exit 0\necho 'ptxas fatal: broken' >&2; exit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(probe, "_locate", lambda tool: str(fake))
    got = probe.check("xla.ptxas")
    assert not got["ok"] and "ptxas could not assemble a kernel: ptxas fatal: broken" in got["detail"]
