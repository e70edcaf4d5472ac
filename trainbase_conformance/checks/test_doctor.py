"""The image's own preflight, `tb-doctor`: it runs in every image within its time budget, its
JSON follows docs/doctor.schema.json, it is honest about this host (no GPU -> "skipped: no
GPU", never ok), each fault injected into a fresh container is named by the right check with
a fix hint, and across 2 containers x 2 ranks rank 0 alone prints the node x check table
naming the container that lacks a mount the other has. On GPU/RDMA runners the same tool
runs with --expect, so the gpu and fabric tiers are the doctor's checks."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest

from trainbase_conformance.containers import Container
from trainbase_conformance.fixtures import DOCTOR_SCHEMA, start_cluster

DOCTOR_BUDGET_S = 10  # the bound for a run without a collective

pytestmark = pytest.mark.trainbase_contract("tb-doctor")


@pytest.mark.cpu
@pytest.mark.evidence("run")
def test_doctor_passes_on_this_node_within_budget(target):
    """`tb-doctor --json` runs every check, exits 0 (nothing fails on a well-started
    container), and takes under 10 s, measured from outside the container."""
    t0 = time.monotonic()
    rc, report = target.doctor()
    took = time.monotonic() - t0
    failing = [f"{c['id']}: {c['summary']}" for c in report["checks"] if c["status"] == "fail"]
    assert rc == 0 and not failing, f"the image fails its own doctor here: {failing}"
    assert report["node"]["image"] == target.name
    assert len(report["checks"]) >= 15, [c["id"] for c in report["checks"]]
    assert took < DOCTOR_BUDGET_S, f"tb-doctor took {took:.1f} s (budget {DOCTOR_BUDGET_S} s)"


@pytest.mark.cpu
@pytest.mark.evidence("run")
def test_doctor_gpu_checks_are_honest(target):
    """Without a GPU handed to the container the GPU checks say "skipped: no GPU" (never ok);
    with one they pass. --expect gpu turns the absence into a failure."""
    _, report = target.doctor()
    gpu = {c["id"]: c for c in report["checks"] if c["id"] in ("gpu.visible", "gpu.driver", "nccl.network")}
    assert len(gpu) == 3
    if target.caps.gpu:
        assert gpu["gpu.visible"]["status"] == "ok" and gpu["gpu.driver"]["status"] == "ok", gpu
        # NCCL over sockets on a GPU host without RDMA is a warning (slow multi-node), not ok;
        # with RDMA devices in the container it must be ok
        want = {"ok"} if target.caps.ib else {"ok", "warn"}
        assert gpu["nccl.network"]["status"] in want, gpu["nccl.network"]
        return
    for c in gpu.values():
        assert c["status"] == "skip" and "no GPU" in c["summary"], (
            f"no GPU in this container, but {c['id']} says {c['status']}: {c['summary']}"
        )
    rc, expecting = target.doctor("--expect gpu --only gpu")
    assert rc == 1 and {c["status"] for c in expecting["checks"]} == {"fail"}, expecting["checks"]


@pytest.mark.cpu
@pytest.mark.evidence("run")
def test_doctor_memlock_is_what_the_container_has(target):
    """The doctor's memlock is the container's `ulimit -l`; a limit (8 MiB here) is reported
    with its fix unless CAP_IPC_LOCK lifts it."""
    c = target.doctor_check("mem.memlock")
    shell = target.sh("ulimit -l").stdout.strip()
    want = -1 if shell == "unlimited" else int(shell) * 1024
    assert c["facts"]["limit_bytes"] == want, f"doctor says {c['facts']}, `ulimit -l` says {shell}"
    if want == -1 or c["facts"]["cap_ipc_lock"]:
        assert c["status"] == "ok", c
    else:
        assert c["status"] in ("warn", "fail") and "--ulimit memlock=-1" in c["hint"], c


# Each fault, put into a fresh container of the image: (shell run as root before the doctor,
# environment of the doctor's process, the check that must fail, words its summary must hold).
FAULTS = {
    # renamed out of ldconfig's sight: it re-links any lib*.so* file by its soname
    "libnccl-hidden": (
        "find / -xdev -name 'libnccl.so*' -exec sh -c 'mv \"$0\" \"${0%/*}/hidden-nccl-${0##*/}\"' {} \\; && ldconfig",
        {},
        "nccl.library",
        "does not load",
    ),
    # every PATH folder: the image's own and tb-entrypoints' wrappers in /usr/local/bin
    "launcher-off-path": (
        "for l in mpirun mpiexec; do for d in $(echo $PATH | tr : ' '); do "
        "if [ -e $d/$l ]; then mv $d/$l $d/$l.moved; fi; done; done",
        {},
        "mpi.launcher",
        "command not found",
    ),
    "second-nccl-first-on-library-path": (
        "mkdir -p /opt/shadow && cp \"$(ldconfig -p | awk '/libnccl.so.2 /{print $NF; exit}')\" /opt/shadow/",
        {"LD_LIBRARY_PATH": "/opt/shadow"},
        "nccl.shadow",
        "/opt/shadow/libnccl.so.2 (LD_LIBRARY_PATH, loaded)",
    ),
    "inconsistent-rank-variables": (
        "true",
        {
            "OMPI_COMM_WORLD_RANK": "1",
            "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "RANK": "0",
        },
        "launch.contract",
        "RANK=0 (the launcher's RANK is 1)",
    ),
    "nccl-settings-contradict-node": ("true", {"NCCL_SOCKET_IFNAME": "ib9"}, "nccl.env", "matches no interface"),
}


@pytest.mark.cpu
@pytest.mark.evidence("run")
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_doctor_names_an_injected_fault(target, host_caps, fault):
    """The fault makes the doctor exit 1, the named check fails with a fix hint, and the same
    check passes on the untouched image (so the failure is the fault's)."""
    setup, env, check_id, words = FAULTS[fault]
    assert target.doctor_check(check_id)["status"] in ("ok", "skip"), "the control (untouched image) fails"
    c = Container.start(target.ref, host_caps.run_options(), prefix="tbconf-fault")
    try:
        r = c.exec(setup, timeout=120)
        assert r.returncode == 0, f"injecting {fault} failed: {r.stderr.strip()[-500:]}"
        if "LD_LIBRARY_PATH" in env:  # in front of the image's own path, as a user's setting would be
            own = c.exec("echo $LD_LIBRARY_PATH").stdout.strip()
            env = {**env, "LD_LIBRARY_PATH": ":".join(p for p in (env["LD_LIBRARY_PATH"], own) if p)}
        rc, report = target.doctor(env=env, container=c)
    finally:
        c.remove()
    got = next(x for x in report["checks"] if x["id"] == check_id)
    assert rc == 1, f"{fault}: the doctor exited 0 (nothing failed): {report['summary']}"
    assert got["status"] == "fail" and words in got["summary"], f"{fault}: {check_id} said {got}"
    assert got["hint"], f"{fault}: {check_id} gives no fix"


@pytest.mark.multinode
@pytest.mark.evidence("run")
def test_doctor_cluster_names_the_node_without_the_mount(target, host_caps):
    """mpirun across 2 containers x 2 ranks, `tb-doctor --cluster --allreduce mpi`: rank 0 alone
    prints one node x check table, it names b as lacking /data (a tmpfs only a has), the
    checked MPI all-reduce is correct, and the job exits 1 for the difference."""
    with start_cluster(target, host_caps, extra={"a": {"tmpfs": ("/data",)}}) as cluster:
        # through the launch contract, as documented: it gives every rank MASTER_ADDR & co.
        run = f"tb-launch --hosts {','.join(cluster.hosts)} tb-doctor --cluster"
        text = cluster.launch(2, f"{run} --allreduce mpi", timeout=240)
        js = cluster.launch(2, f"{run} --json", timeout=240)
    out = text.stdout
    # every rank exits 1; Open MPI's mpirun passes that on, Intel MPI's Hydra may answer 255
    # once it tears the other ranks down: the launcher's code is non-zero, the JSON's is 1
    assert text.returncode != 0, (
        f"the job exited {text.returncode} though b lacks the /data a has: {out[-1500:]}{text.stderr[-1500:]}"
    )
    assert out.count("tb-doctor: 2 node(s), 4 rank(s)") == 1, f"the table must be printed once (rank 0):\n{out}"
    rows = [ln.split() for ln in out.splitlines() if ln.split()[:1] in (["a"], ["b"])]
    assert [r[:2] for r in rows] == [["a", "0-1"], ["b", "2-3"]], out
    assert "node.mounts: mounts /data missing on b (present on a)" in out, (
        f"the table does not name b's missing /data:\n{out}"
    )
    assert "all-reduce (mpi, 4 ranks, 8 MiB): values correct" in out, f"no checked MPI all-reduce of 4 ranks:\n{out}"
    assert js.stdout.count('"mode": "cluster"') == 1, f"one JSON document (rank 0):\n{js.stdout[-2000:]}"
    report = json.loads(js.stdout[js.stdout.index("{") :])
    jsonschema.validate(report, DOCTOR_SCHEMA)
    assert report["world_size"] == 4 and len(report["ranks"]) == 4 and report["exit_code"] == 1
    assert [d["nodes"] for d in report["differences"] if d["check"] == "node.mounts"] == [["b"]], report["differences"]


@pytest.mark.multinode
@pytest.mark.evidence("run")
def test_doctor_cluster_allreduce_through_torch(target, host_caps):
    """Images with PyTorch: the all-reduce path the GPU nodes take (torch.distributed, rendezvous
    at rank 0's host) run with gloo on CPUs across 2 containers x 2 ranks, every value checked."""
    if "pytorch" not in (target.manifest.get("frameworks") or {}):
        pytest.skip(f"n/a: {target.name} has no PyTorch")
    with start_cluster(target, host_caps) as cluster:
        r = cluster.launch(
            2,
            f"tb-launch --hosts {','.join(cluster.hosts)} tb-doctor --cluster --json "
            "--only image,launch --allreduce gloo",
            timeout=300,
        )
    assert r.stdout.count('"mode": "cluster"') == 1, f"exit {r.returncode}: {r.stdout[-1500:]}{r.stderr[-1500:]}"
    report = json.loads(r.stdout[r.stdout.index("{") :])
    jsonschema.validate(report, DOCTOR_SCHEMA)
    coll = report["allreduce"]
    assert coll["backend"] == "gloo" and coll["ranks"] == 4 and coll["ok"], f"the gloo all-reduce of 4 ranks: {coll}"
    assert coll["busbw_GBps"] > 0 and report["exit_code"] == 0 and r.returncode == 0, (
        f"exit {r.returncode} (report: {report['exit_code']}), busbw {coll['busbw_GBps']} GB/s: {report['differences']}"
    )


@pytest.mark.gpu
@pytest.mark.evidence("run")
def test_doctor_on_a_gpu_runner(target):
    """The gpu tier is the doctor with --expect gpu: GPUs visible, the driver new enough, and a
    one-process NCCL init whose log names its network."""
    rc, report = target.doctor("--expect gpu")
    bad = [f"{c['id']}: {c['summary']}" for c in report["checks"] if c["status"] == "fail"]
    # the list as a string: pytest shortens a long object's repr ("...") and hides the causes
    assert rc == 0 and not bad, repr(bad)
    net = next(c for c in report["checks"] if c["id"] == "nccl.network")
    print(f"NCCL selected {net['facts'].get('network')}: {net['summary']}")


@pytest.mark.fabric
@pytest.mark.evidence("run")
def test_doctor_on_an_rdma_runner(target):
    """The fabric tier is the doctor with --expect ib: devices handed in, ports ACTIVE, the
    provider opens each device, memlock fit for registration, NCCL settings agree."""
    rc, report = target.doctor("--expect ib --only ib,mem,nccl.env")
    bad = [f"{c['id']}: {c['summary']}" for c in report["checks"] if c["status"] == "fail"]
    assert rc == 0 and not bad, bad
