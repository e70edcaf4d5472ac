"""Frameworks: what the manifest claims about PyTorch, TensorFlow, Horovod and DeepSpeed, and
distributed runs that check their own values, launched per process (mpirun + tb-launch, two
containers) and per node (torchrun in each container). The scripts are examples/*.py."""

from __future__ import annotations

import concurrent.futures
import re
import shlex
import textwrap

import pytest

from trainbase_conformance.resources import EXAMPLES

EX = "/tmp/tbconf/ex"


def frameworks(target) -> dict[str, str]:
    return target.manifest.get("frameworks") or {}


def need(target, fw: str) -> str:
    version = frameworks(target).get(fw)
    if not version:
        if target.manifest.get("foreign"):  # skipped where the image holds none, else failed: what to declare
            target.require(f"frameworks.{fw}")
        pytest.skip(f"{target.name} has no {fw} (its manifest lists: {', '.join(frameworks(target)) or 'none'})")
    return version


def put_examples(*containers) -> None:
    for c in containers:
        c.exec(f"mkdir -p {EX}", timeout=60)
        c.put(f"{EXAMPLES}/.", EX)


def wheel_machine(target, dist: str) -> tuple[str, str]:
    """(the machine the framework's wheel was built for, per its WHEEL tags; the image's own):
    an arm64 image must carry the aarch64 build of torch/TensorFlow, not an x86_64 one that pip
    could only have installed by mistake (and that would die with "exec format error")."""
    info = py_json(
        target,
        f"""
        import importlib.metadata as md, platform
        tags = [l.split(":", 1)[1].strip() for l in md.distribution({dist!r}).read_text("WHEEL").splitlines()
                if l.startswith("Tag:")]
        print(json.dumps({{"tags": tags, "machine": platform.machine()}}))
    """,
    )
    machines = {m for t in info["tags"] for m in ("x86_64", "aarch64") if t.endswith(m)}
    return ",".join(sorted(machines)) or "any (" + " ".join(info["tags"]) + ")", info["machine"]


def py_json(target, code: str, timeout: int = 240, env: dict[str, str] | None = None):
    """Run a Python snippet with the image's Python (``env`` added to its environment); its
    last stdout line is JSON."""
    code = "import json\n" + textwrap.dedent(code)
    assign = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    return target.json_probe(f"{assign}{target.python} -c {shlex.quote(code)}", timeout=timeout)


def pinned(target, fw: str) -> dict[str, str]:
    """The packages matrix.yaml pins for framework ``fw`` (from the manifest): name -> version."""
    return (target.manifest.get("framework_packages") or {}).get(fw) or {}


def ok_lines(stdout: str) -> list[dict[str, str]]:
    """The `OK key=value ...` line each rank of an example prints (found anywhere in a line:
    launchers may prefix their children's output)."""
    return [dict(kv.split("=", 1) for kv in m.group(1).split()) for m in re.finditer(r"\bOK ((?:\w+=\S+ ?)+)", stdout)]


def trained(lines: list[dict[str, str]], n: int, key: str = "rank") -> None:
    """Exactly ranks 0..n-1 reported OK, each once (two worlds of 2 also print 4 OK lines)."""
    got = sorted(int(x[key]) for x in lines)
    assert got == list(range(n)), f"{key}s that reported OK: {got}, want 0..{n - 1}: {lines}"


# ----------------------------------------------------------------------------- GPU code

# What each framework's wheel says it carries, read without a GPU: torch's arch flags (what
# torch.cuda.get_arch_list() returns on a GPU node; a CPU build has torch.version.cuda None),
# TensorFlow's build info (cuda_compute_capabilities; is_cuda_build False in a CPU build).
GPU_CODE_PROBES = {
    "pytorch": """
        import torch
        cuda = torch.version.cuda
        print(json.dumps({"version": torch.__version__, "cuda": cuda,
                          "code": torch._C._cuda_getArchFlags().split() if cuda else []}))
    """,
    "tensorflow": """
        import tensorflow as tf
        b = tf.sysconfig.get_build_info()
        print(json.dumps({"version": tf.__version__, "cuda": b.get("cuda_version") if b.get("is_cuda_build") else None,
                          "code": list(b.get("cuda_compute_capabilities") or [])}))
    """,
}


@pytest.mark.static
@pytest.mark.evidence("load")
@pytest.mark.trainbase_contract("the manifest's gpu_code")
def test_framework_wheels_carry_the_declared_gpu_code(target):
    """Each framework's wheel is the CUDA build whose GPU code the manifest declares (matrix.yaml's
    gpu_code, from which the catalogue says which GPUs the image is built for). A CPU build -- PyPI's
    aarch64 torch 2.10.0 is 2.10.0+cpu -- or a wheel of other code makes the catalogue's promise
    false: the image would train on the CPU, or stop at "no kernel image is available" on a GPU it
    is listed for."""
    declared: dict[str, list[str]] = target.manifest.get("gpu_code") or {}
    if not declared:
        pytest.skip(
            f"{target.name} declares no framework wheel's GPU code (frameworks: {', '.join(frameworks(target)) or 'none'})"
        )
    wrong = []
    for fw, code in declared.items():
        if fw not in GPU_CODE_PROBES:
            wrong.append(f"the manifest declares {fw}'s GPU code and no probe reads it (GPU_CODE_PROBES)")
            continue
        info = py_json(target, GPU_CODE_PROBES[fw])
        if info["cuda"] is None:
            wrong.append(
                f"{fw} {info['version']} is a CPU build (no CUDA): the image would train on the CPU of every node, "
                f"the manifest declares its GPU code {code}"
            )
        elif sorted(info["code"]) != sorted(code):
            extra = sorted(set(info["code"]) - set(code))
            missing = sorted(set(code) - set(info["code"]))
            wrong.append(
                f"{fw} {info['version']}'s wheel carries GPU code {info['code']}, the manifest declares {code}"
                + (f": it lacks {missing}" if missing else "")
                + (f"; it also has {extra}" if extra else "")
            )
    assert not wrong, "; ".join(wrong)


# ----------------------------------------------------------------------------- PyTorch


@pytest.mark.static
@pytest.mark.evidence("load")
def test_pytorch_build_matches_manifest(target):
    version = need(target, "pytorch")
    c = target.components
    info = py_json(
        target,
        """
        import torch, torch.distributed as d
        print(json.dumps({"version": torch.__version__.split("+")[0], "cuda": torch.version.cuda,
                          "cudnn": torch.backends.cudnn.version(), "nccl": list(torch.cuda.nccl.version()),
                          "nccl_ok": d.is_nccl_available(), "gloo_ok": d.is_gloo_available()}))
    """,
    )
    assert info["version"] == version, f"torch {info['version']} in the image, the manifest says PyTorch {version}"
    assert info["cuda"].split(".")[:2] == c["cuda"]["version"].split(".")[:2], (
        f"torch is built for CUDA {info['cuda']}, the manifest says CUDA {c['cuda']['version']}"
    )
    major, minor, patch = (int(x) for x in c["cudnn"]["version"].split(".")[:3])
    assert info["cudnn"] == major * 10000 + minor * 100 + patch, (
        f"torch runs cuDNN {info['cudnn']}, the manifest says {c['cudnn']['version']}"
    )
    assert ".".join(map(str, info["nccl"])) == c["nccl"]["version"], (
        f"torch runs NCCL {'.'.join(map(str, info['nccl']))}, the manifest says {c['nccl']['version']}"
    )
    assert info["nccl_ok"] and info["gloo_ok"], f"torch.distributed lacks a backend: {info}"
    built, machine = wheel_machine(target, "torch")
    assert built == machine, f"torch's wheel is built for {built}, the image runs {machine}"


@pytest.mark.static
@pytest.mark.evidence("load")
def test_one_nccl_the_framework_really_uses(target):
    """torch loads exactly the image's NCCL: the only libnccl.so.2 on disk, at the manifest's version."""
    need(target, "pytorch")
    found = target.sh("find / -xdev -name 'libnccl.so.2*' -type f 2>/dev/null").stdout.split()
    assert len(found) == 1, f"more than one NCCL in the image: {found}"
    info = py_json(
        target,
        """
        import torch
        torch.cuda.nccl.version()          # loads libnccl
        maps = open("/proc/self/maps").read().splitlines()
        print(json.dumps(sorted({l.split()[-1] for l in maps if "libnccl" in l})))
    """,
    )
    assert list(info) and all(p.startswith(found[0].rsplit("/", 1)[0]) for p in info), (info, found)


@pytest.mark.multinode
@pytest.mark.evidence("run")
@pytest.mark.trainbase_contract("tb-launch")
def test_pytorch_per_process_mpirun_across_two_containers(cluster, target):
    need(target, "pytorch")
    put_examples(*cluster.nodes)
    r = cluster.launch(
        2,
        f"env MASTER_ADDR=a MASTER_PORT=29511 tb-launch {cluster.python} {EX}/pytorch_ddp.py --backend gloo",
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ranks = ok_lines(r.stdout)
    trained(ranks, 4)
    assert {x["world"] for x in ranks} == {"4"} and {x["allreduce"] for x in ranks} == {"10"}, (
        f"want a world of 4 whose all-reduce of 1..4 gives 10 on every rank: {ranks}"
    )
    assert len({x["params"] for x in ranks}) == 1, f"the ranks' parameters differ: {ranks}"
    pairs = sorted((x["rank"], x["node_rank"]) for x in ranks)
    assert pairs == [("0", "0"), ("1", "0"), ("2", "1"), ("3", "1")], (
        f"(rank, NODE_RANK) {pairs}: ranks 0-1 run in container a (node 0), 2-3 in b (node 1)"
    )


@pytest.mark.multinode
@pytest.mark.evidence("run")
def test_pytorch_per_node_torchrun_in_each_container(cluster, target):
    need(target, "pytorch")
    put_examples(*cluster.nodes)

    def node(i):
        return cluster.nodes[i].exec(
            f"timeout 300 {target.components['python']['prefix']}/bin/torchrun --nnodes 2 --nproc-per-node 2 "
            f"--node-rank {i} --master-addr a --master-port 29512 {EX}/pytorch_ddp.py --backend gloo",
            timeout=330,
        )

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(node, [0, 1]))
    for i, r in enumerate(results):
        assert r.returncode == 0, f"node {i}: " + r.stdout[-1500:] + r.stderr[-1500:]
    ranks = [x for r in results for x in ok_lines(r.stdout)]
    trained(ranks, 4)
    assert len({x["params"] for x in ranks}) == 1 and {x["allreduce"] for x in ranks} == {"10"}, (
        f"want one set of parameters and the all-reduce of 1..4 (10) on every rank: {ranks}"
    )


@pytest.mark.static
@pytest.mark.evidence("content")
@pytest.mark.trainbase_contract("the manifest's framework_packages")
def test_framework_packages_are_the_pinned_versions(target):
    """Every package matrix.yaml pins for the image's frameworks is installed at that version."""
    pins = {name: ver for fw in frameworks(target) for name, ver in pinned(target, fw).items()}
    if not pins:
        pytest.skip(f"{target.name} pins no framework packages")
    found = py_json(
        target,
        f"""
        import importlib.metadata as md
        out = {{}}
        for name in {sorted(pins)!r}:
            try:
                out[name] = md.version(name)
            except md.PackageNotFoundError:
                out[name] = None
        print(json.dumps(out))
    """,
    )
    wrong = {n: (found.get(n), v) for n, v in pins.items() if found.get(n) != v}
    assert not wrong, f"installed vs pinned: {wrong}"


# ----------------------------------------------------------------------------- TensorFlow


@pytest.mark.static
@pytest.mark.evidence("load")
def test_tensorflow_build_matches_manifest(target):
    version = need(target, "tensorflow")
    info = py_json(
        target,
        """
        import tensorflow as tf
        b = tf.sysconfig.get_build_info()
        print(json.dumps({"version": tf.__version__, "cuda": b.get("cuda_version"),
                          "cudnn": b.get("cudnn_version"), "gpu_build": tf.test.is_built_with_cuda()}))
    """,
    )
    assert info["version"] == version, f"tensorflow {info['version']} in the image, the manifest says {version}"
    assert info["gpu_build"] is True, f"this TensorFlow is built without CUDA (a CPU-only wheel): {info}"
    # TF's wheels are built against an older CUDA 12 and run on the image's newer 12.x runtime
    c = target.components
    assert str(info["cuda"]).split(".")[0] == c["cuda"]["version"].split(".")[0], (
        f"TensorFlow is built for CUDA {info['cuda']}, the manifest says CUDA {c['cuda']['version']}"
    )
    assert str(info["cudnn"]).split(".")[0] == c["cudnn"]["version"].split(".")[0], (
        f"TensorFlow is built for cuDNN {info['cudnn']}, the manifest says cuDNN {c['cudnn']['version']}"
    )
    built, machine = wheel_machine(target, "tensorflow")
    assert built == machine, f"tensorflow's wheel is built for {built}, the image runs {machine}"


@pytest.mark.multinode
@pytest.mark.evidence("run")
@pytest.mark.trainbase_contract("tb-launch")
def test_tensorflow_multiworker_across_two_containers(cluster, target):
    need(target, "tensorflow")
    put_examples(*cluster.nodes)
    r = cluster.launch(
        1,
        f"env TRAINBASE_HOSTS=a,b TF_CPP_MIN_LOG_LEVEL=2 tb-launch --tf {cluster.python} {EX}/tf_multiworker.py",
        timeout=400,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    workers = ok_lines(r.stdout)
    trained(workers, 2, key="worker")
    assert {x["allreduce"] for x in workers} == {"3"}, (
        f"the all-reduce of 1 and 2 over both workers must give 3 on each: {workers}"
    )


# ----------------------------------------------------------------------------- Horovod


@pytest.mark.static
@pytest.mark.evidence("load")
def test_horovod_check_build_shows_claimed_frameworks_and_controllers(target):
    version = need(target, "horovod")
    r = target.sh("horovodrun --check-build", timeout=120)
    assert r.rc == 0, f"horovodrun --check-build exited {r.rc}: {r.stderr[-1500:]}"
    assert f"Horovod v{version}" in r.stdout, f"horovodrun --check-build does not say Horovod v{version}: {r.stdout}"
    checked = {m.group(1).strip() for m in re.finditer(r"\[X\]\s+(\S[^\n]*)", r.stdout)}
    assert {"PyTorch", "MPI", "Gloo"} <= checked, (
        f"horovodrun --check-build lacks {sorted({'PyTorch', 'MPI', 'Gloo'} - checked)}: {r.stdout}"
    )
    # what --check-build lists is the build's configuration: the extension must also load and
    # report the same controllers from the library itself
    info = py_json(
        target,
        """
        import horovod
        import horovod.torch as hvd
        print(json.dumps({"version": horovod.__version__, "mpi": hvd.mpi_built(), "gloo": hvd.gloo_built()}))
    """,
    )
    assert info == {"version": version, "mpi": True, "gloo": True}, (
        f"horovod.torch reports {info}, the build claims {version} with MPI and Gloo"
    )


@pytest.mark.multinode
@pytest.mark.evidence("run")
def test_horovod_allreduce_four_ranks_across_two_containers(cluster, target):
    need(target, "horovod")
    put_examples(*cluster.nodes)
    r = cluster.launch(2, f"{cluster.python} {EX}/horovod_allreduce.py", timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ranks = ok_lines(r.stdout)
    trained(ranks, 4)
    assert {x["size"] for x in ranks} == {"4"} and {x["allreduce"] for x in ranks} == {"10"}, (
        f"want one Horovod world of 4 whose all-reduce of 1..4 gives 10 on every rank: {ranks}"
    )


# ----------------------------------------------------------------------------- DeepSpeed


@pytest.mark.static
@pytest.mark.evidence("load")
def test_deepspeed_report_lists_the_prebuilt_ops_as_installed(target):
    """`ds_report` for the CUDA accelerator a GPU node selects runs, names the pinned version,
    and lists every op the manifest says was prebuilt as installed -- DeepSpeed's own view of
    its build, beside the suite's import of each op (test_gpu_paths.py). The CPU accelerator's
    shared-memory op is not among them: built for CUDA, DeepSpeed compiles it on a CPU-only
    node's first init_distributed (g++ is in the image)."""
    version = need(target, "deepspeed")
    r = target.sh("DS_ACCELERATOR=cuda ds_report", timeout=240)
    assert r.rc == 0, r.stderr[-1500:]
    assert re.search(rf"deepspeed info \.+ {re.escape(version)}", r.stdout), r.stdout[-1500:]
    plain = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout)  # ds_report colours its table
    listed = dict(re.findall(r"^(\w+) \.+ \[(YES|NO)\]", plain, re.M))
    ops = (target.manifest.get("prebuilt_ops") or {}).get("deepspeed") or []
    not_installed = {op: listed.get(op, "not listed") for op in ops if listed.get(op) != "YES"}
    assert not not_installed, f"ds_report does not list these prebuilt ops as installed: {not_installed}"


@pytest.mark.multinode
@pytest.mark.evidence("run")
def test_deepspeed_init_distributed_under_mpirun(cluster, target):
    need(target, "deepspeed")
    put_examples(*cluster.nodes)
    r = cluster.launch(2, f"env MASTER_ADDR=a MASTER_PORT=29513 {cluster.python} {EX}/deepspeed_init.py", timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ranks = ok_lines(r.stdout)
    trained(ranks, 4)
    assert {x["world"] for x in ranks} == {"4"}, f"init_distributed must give every rank the world of 4: {ranks}"


# ----------------------------------------------------------------------------- GPU tier


@pytest.mark.gpu
@pytest.mark.evidence("run")
def test_pytorch_nccl_allreduce_on_all_local_gpus(target):
    """DDP over NCCL with one process per GPU the HOST lists (nvidia-smi -L): torch must see
    every one of them, not just the count the container happens to see -- an image that pins
    CUDA_VISIBLE_DEVICES, or a runtime that exposes one GPU, would otherwise pass on 1 of 8."""
    need(target, "pytorch")
    put_examples(target.container)
    host = target.caps.gpu_count
    seen = target.sh(f"{target.python} -c 'import torch; print(torch.cuda.device_count())'").stdout.strip()
    assert seen == str(host), f"torch sees {seen or 'no'} GPU(s) in the container, the host lists {host}"
    r = target.sh(
        f"{target.components['python']['prefix']}/bin/torchrun --nproc-per-node {host} {EX}/pytorch_ddp.py "
        f"--backend nccl",
        timeout=600,
    )
    assert r.rc == 0, f"torchrun --nproc-per-node {host} over NCCL exited {r.rc}: {r.stderr[-2000:]}"
    ok = ok_lines(r.stdout)
    assert len(ok) == host, f"{len(ok)} of {host} ranks reported OK: {r.stdout[-1500:]}"
