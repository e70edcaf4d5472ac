"""Checks whose only failure was shown where CI never shows it -- a broken variant of a DeepSpeed,
TensorFlow or Horovod image (the ci profile builds none), or Azure ML's image, whose mpirun refuses
root before the check's own asserts run -- judged here on fake answers in the real tools' formats:
the probe snippets' JSON, `nvcc --version` and `cuobjdump --list-elf/--list-ptx`, and the TBCONF
lines of probes/allreduce.c and probes/allreduce_mpi4py.py under mpirun."""

import json
import re
from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_gpu_paths as gp
from trainbase_conformance.checks import test_mpi

from .framework_fakes import mpi_flavor
from .test_gpu_path_checks import ARCHS, FakeTarget

TF = {"tensorflow": "2.21.0"}
DS = {"deepspeed": "0.19.8", "pytorch": "2.15.0"}


# --------------------------------------------------------------------------- TensorFlow's CUDA libraries


def tf_libs(**change):
    return {
        "wanted": ["nvidia-cublas-cu12", "nvidia-cufft-cu12", "nvidia-nccl-cu12"],
        "missing": [],
        "unloadable": {},
        "old": {},
        "loaded": ["libcublas.so.12", "libcufft.so.11", "libnccl.so.2"],
        **change,
    }


@pytest.mark.parametrize(
    "change, why",
    [
        ({"missing": ["nvidia-cufft-cu12"]}, r"TensorFlow's GPU devices need nvidia-cufft-cu12, not installed"),
        (
            {
                "unloadable": {
                    "libcufft.so.11": "libcufft.so.11: cannot open shared object file: No such file or directory"
                }
            },
            r"CUDA libraries TensorFlow loads do not resolve by soname: \{'libcufft\.so\.11'",
        ),
        ({"wanted": []}, r"tensorflow's metadata names no and-cuda extra"),
    ],
)
def test_tensorflow_without_a_cuda_library_it_loads_fails(change, why):
    gp.test_tensorflow_gpu_libraries_resolve(FakeTarget(TF, tf_libs()))
    with pytest.raises(AssertionError, match=why):
        gp.test_tensorflow_gpu_libraries_resolve(FakeTarget(TF, tf_libs(**change)))


# --------------------------------------------------------------------------- DeepSpeed's prebuilt ops


def ds_target(answer):
    t = FakeTarget(DS, answer)
    t.manifest["prebuilt_ops"] = {"deepspeed": ["cpu_adam", "fused_adam"]}
    return t


SO = "/opt/trainbase/venv/lib/python3.11/site-packages/deepspeed/ops/adam/{}_op.cpython-311-x86_64-linux-gnu.so"


def op(name, installed=True, s=0.2, **change):
    return {"installed": installed, "file": SO.format(name), "s": s, **change}


@pytest.mark.parametrize(
    "fused, why",
    [
        (
            op("fused_adam", installed=False),
            r"DeepSpeed ops the image claims prebuilt that are not: \{'fused_adam': "
            r"\{'installed': False",
        ),
        (
            {"installed": True, "error": "ImportError: libcudart.so.13: cannot open shared object file"},
            r"not: \{'fused_adam': \{'installed': True, 'error': 'ImportError",
        ),
        (op("fused_adam", s=42.0), r"importing these ops took seconds \(a JIT build\?\): \{'fused_adam': 42\}"),
    ],
)
def test_a_deepspeed_op_that_is_not_really_prebuilt_fails(fused, why):
    gp.test_deepspeed_prebuilt_ops_load_without_a_compiler_run(
        ds_target({"cpu_adam": op("cpu_adam"), "fused_adam": op("fused_adam")})
    )
    with pytest.raises(AssertionError, match=why):
        gp.test_deepspeed_prebuilt_ops_load_without_a_compiler_run(
            ds_target({"cpu_adam": op("cpu_adam"), "fused_adam": fused})
        )


# --------------------------------------------------------------------------- nvcc and the extension toolchain


def nvcc_out(release="13.2", sms=("sm_80", "sm_89", "sm_90", "sm_100")):
    """What the check's command prints: command -v, nvcc --version's last 2 lines, cuobjdump's lists."""
    elf = "".join(f"ELF file    {i}: k.{i}.{s}.cubin\n" for i, s in enumerate(sms, 1))
    return (
        f"/opt/trainbase/venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc\n"
        f"Cuda compilation tools, release {release}, V{release}.86\nBuild cuda_{release}.r{release}/compiler.0\n"
        f"{elf}PTX file    1: k.1.sm_100.ptx\n"
    )


@pytest.mark.parametrize(
    "rc, stdout, why",
    [
        (1, "sh: 1: nvcc: not found", r"nvcc could not compile a kernel for 8\.0, 8\.9, 9\.0, 10\.0"),
        (0, nvcc_out(release="12.8"), r"nvcc on PATH is not CUDA 13\.2"),
        (0, nvcc_out(sms=("sm_90",)), r"the kernel object lacks \['sm_80', 'sm_89'\]"),
    ],
)
def test_nvcc_that_cannot_compile_for_every_declared_gpu_fails(rc, stdout, why):
    gp.test_nvcc_compiles_for_every_declared_gpu(FakeTarget(DS, stdout=nvcc_out()))
    with pytest.raises(AssertionError, match=why):
        gp.test_nvcc_compiles_for_every_declared_gpu(FakeTarget(DS, stdout=stdout, rc=rc))


EXT = {"cuda_home": "/x", "module": "/tmp/tmpab12/tb_twice.so", "seconds": 41}


@pytest.mark.parametrize(
    "answer, why",
    [
        (
            {
                "cuda_home": "/x",
                "error": "RuntimeError: Error building extension 'tb_twice': /bin/sh: 1: /x/bin/nvcc: not found",
            },
            r"torch could not build a CUDA extension with the image's CUDA_HOME \(/x\): RuntimeError: Error building",
        ),
        ({**EXT, "cuda_home": "/usr/local/cuda"}, r"torch finds CUDA at /usr/local/cuda, the image's is /x"),
        ({**EXT, "module": "/tmp/tmpab12/tb_twice.py"}, r"tb_twice\.py"),
    ],
)
def test_a_cuda_extension_that_does_not_build_with_the_image_toolchain_fails(answer, why):
    gp.test_torch_cuda_extension_builds_with_the_image_toolchain(FakeTarget(DS, EXT))
    with pytest.raises(AssertionError, match=why):
        gp.test_torch_cuda_extension_builds_with_the_image_toolchain(FakeTarget(DS, answer))


# --------------------------------------------------------------------------- 4-rank MPI jobs in one container

LIB = (
    "Open MPI v4.1.4, package: Open MPI root@buildkitsandbox Distribution, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"
)


def c_rank(r, n=4, ok=True):
    """probes/allreduce.c's line."""
    return "TBCONF " + json.dumps(
        {"probe": "c", "rank": r, "size": n, "host": "a", "sum": 10 if ok else 4, "bad": 0 if ok else 1024, "ok": ok},
        separators=(",", ":"),
    )


def py_rank(r, n=4, ok=True, lib=LIB):
    """probes/allreduce_mpi4py.py's line."""
    return "TBCONF " + json.dumps({"rank": r, "size": n, "library": lib, "ok": ok})


class MpiTarget:
    """One container of an Open MPI image: mpicc builds, and ``mpirun -np 4`` prints ``lines``."""

    def __init__(self, lines, rc=0, stderr="", compiles=(0, "")):
        self.python, self.cache, self.mpi = "/opt/trainbase/venv/bin/python", {}, mpi_flavor("openmpi")
        self.lines, self.rc, self.stderr, self.compiles = lines, rc, stderr, compiles

    def need_mpi(self):
        return self.mpi

    def sh(self, cmd, timeout=None):
        if "mpicc" in cmd:
            return SimpleNamespace(rc=self.compiles[0], stdout="", stderr=self.compiles[1])
        return SimpleNamespace(rc=self.rc, stdout="".join(ln + "\n" for ln in self.lines), stderr=self.stderr)


ROOT_REFUSED = (
    "--------------------------------------------------------------------------\n"
    "mpirun has detected an attempt to run as root.\n"
)


@pytest.mark.parametrize(
    "target, why",
    [
        (
            MpiTarget([], rc=1, stderr=ROOT_REFUSED),
            r"4-rank run exited 1: -+\n\s*mpirun has detected an attempt to run as root",
        ),
        (MpiTarget([c_rank(r) for r in (0, 1, 2)]), r"mpicc allreduce: ranks seen"),
        (
            MpiTarget([c_rank(0, n=1) for _ in range(4)]),
            r"mpicc allreduce: ranks seen \[\{'probe': 'c', 'rank': 0, 'size': 1",
        ),
        (MpiTarget([c_rank(r, ok=r != 2) for r in range(4)]), r"mpicc allreduce: wrong values on some rank"),
        (MpiTarget([c_rank(r, n=5) for r in range(4)]), r"mpicc allreduce: world sizes \[5, 5, 5, 5\]"),
        (
            MpiTarget([], compiles=(1, "mpicc: error: unable to find the C compiler")),
            r"mpicc could not build a 4-line MPI program",
        ),
    ],
)
def test_the_mpicc_allreduce_fails_on_a_wrong_world_or_wrong_values(target, why):
    test_mpi.test_mpicc_allreduce_4_ranks(MpiTarget([c_rank(r) for r in range(4)]))
    with pytest.raises(AssertionError, match=why):
        test_mpi.test_mpicc_allreduce_4_ranks(target)


@pytest.mark.parametrize(
    "target, why",
    [
        (MpiTarget([], rc=1, stderr=ROOT_REFUSED), r"4-rank mpi4py run exited 1"),
        (MpiTarget([py_rank(r, ok=r != 3) for r in range(4)]), r"mpi4py allreduce: wrong values on some rank"),
        (
            MpiTarget([py_rank(r, lib=LIB.replace("4.1.4", "4.1.2")) for r in range(4)]),
            r"ranks ran on `Open MPI v4\.1\.2.*`, manifest says openmpi 4\.1\.4",
        ),
    ],
)
def test_the_mpi4py_allreduce_fails_on_wrong_values_or_another_mpi(target, why):
    test_mpi.test_mpi4py_allreduce_4_ranks(MpiTarget([py_rank(r) for r in range(4)]))
    with pytest.raises(AssertionError, match=why):
        test_mpi.test_mpi4py_allreduce_4_ranks(target)


CMA = (
    "[a:00042] Read -1, expected 8388608, errno = 1\n"
    "[a:00042] vader_put: process_vm_writev failed: Operation not permitted (errno 1)\n"
)


@pytest.mark.parametrize(
    "target, why",
    [
        (
            MpiTarget([py_rank(r) for r in range(4)], stderr=CMA),
            r"stderr of a default shared-memory run:\n\s*\[a:00042\] Read -1",
        ),
        (MpiTarget([py_rank(r) for r in range(4)], rc=1, stderr=ROOT_REFUSED), r"run exited 1"),
        (MpiTarget([py_rank(r, ok=False) for r in range(4)]), r"shared-memory allreduce: wrong values on some rank"),
    ],
)
def test_a_shared_memory_run_with_warnings_or_wrong_values_fails(target, why):
    test_mpi.test_shared_memory_without_warnings(MpiTarget([py_rank(r) for r in range(4)]))
    with pytest.raises(AssertionError, match=why):
        test_mpi.test_shared_memory_without_warnings(target)


def test_the_fake_lines_are_the_probes_formats():
    """The fields the checks read are the ones the probes print (their sources name them)."""
    from .conftest import ROOT

    c = (ROOT / "trainbase_conformance" / "probes" / "allreduce.c").read_text()
    py = (ROOT / "trainbase_conformance" / "probes" / "allreduce_mpi4py.py").read_text()
    for key in json.loads(c_rank(0).split(" ", 1)[1]):
        assert f'\\"{key}\\"' in c, key
    for key in json.loads(py_rank(0).split(" ", 1)[1]):
        assert re.search(rf"[\"']{key}[\"']", py), key
    assert ARCHS == ["8.0", "8.9", "9.0", "10.0"]


# --------------------------------------------------------------------------- the ping-pong against the host's


def tbspeed(bw_4mib, lib=LIB):
    """probes/pingpong_mpi4py.py's line (rank 0)."""
    return "TBSPEED " + json.dumps(
        {
            "library": lib,
            "size": 2,
            "lat_8B_us": 0.4,
            "bw_64KiB_GBs": 6.0,
            "bw_4MiB_GBs": bw_4mib,
            "allreduce_4MiB_ms": 1.2,
            "pingpong_bytes": 1 << 29,
        }
    )


@pytest.fixture
def host_at_10_gbs(monkeypatch):
    from trainbase_conformance import speed
    from trainbase_conformance.checks import test_speed

    monkeypatch.setattr(speed, "host_reference", lambda *a, **k: speed.parse(tbspeed(10.0)))
    monkeypatch.setattr(speed, "settle", lambda: None)
    monkeypatch.setattr(test_speed, "_transport", lambda target: "pml ob1 (btl tcp,self)")
    monkeypatch.setattr(test_speed, "_contention", lambda target: "host load 1.00 1.00 1.00; in the container: (fake)")
    return test_speed


def test_an_image_far_slower_than_the_host_fails_naming_its_transport(host_at_10_gbs):
    host_at_10_gbs.test_intra_node_bandwidth_is_near_the_hosts(MpiTarget([tbspeed(9.0)]))
    with pytest.raises(
        pytest.fail.Exception,
        match=r"4 MiB ping-pong at 4\.3 GB/s is 0\.43x the host's 10\.0 GB/s "
        r".*below 0\.7x; the image's MPI used: pml ob1 \(btl tcp,self\)",
    ):
        host_at_10_gbs.test_intra_node_bandwidth_is_near_the_hosts(MpiTarget([tbspeed(4.3)]))
    with pytest.raises(AssertionError, match=r"the ping-pong probe exited 1:\s+-+\n\s*mpirun has detected"):
        host_at_10_gbs.test_intra_node_bandwidth_is_near_the_hosts(MpiTarget([], rc=1, stderr=ROOT_REFUSED))
