"""Every collective a training job runs, not only all-reduce: all-gather and reduce-scatter (FSDP,
ZeRO-3), all-to-all (mixture of experts), broadcast from every root, send/recv between every pair
of ranks (pipeline parallelism). probes/collectives.py runs them one process per rank over
torch.distributed, checks every element of every result and times them like nccl-tests (algbw,
busbw): on every local GPU over NCCL (gpu tier), and across two containers over gloo/TCP
(multinode tier). Bandwidth is judged only against the floors the runner declares
(TRAINBASE_RUNNER_EXPECT, floors.py); without them the figures are printed and the bandwidth
checks skip, saying so. Images without PyTorch: test_nccl.py's ctypes all-reduce is their NCCL check."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from trainbase_conformance import floors
from trainbase_conformance.expectations import ExpectationsError
from trainbase_conformance.fixtures import PROBE_DIR

GPU_MAX_BYTES = 256 << 20  # nccl-tests' usual top size, where a link reaches its bandwidth
ACROSS_MAX_BYTES = 4 << 20  # gloo over TCP on any runner: enough to leave latency behind, quick
PER_HOST = 2
ACROSS_PORT = 29533  # on the cluster's private network only


def _need_pytorch(target) -> None:
    version = (target.manifest.get("frameworks") or {}).get("pytorch")
    if not version:
        pytest.skip(
            f"{target.name} has no PyTorch: the collectives probe runs over torch.distributed; "
            f"this image's NCCL is checked by test_nccl_allreduce_gpu (ctypes, all-reduce only)"
        )


def _runner(scope: str) -> tuple[list[floors.Floor], str]:
    try:
        runner = floors.declared_runner()
    except ExpectationsError as e:
        pytest.fail(str(e), pytrace=False)
    if runner is None or not runner.floors.get(scope):
        pytest.skip(floors.no_floor_reason(runner, scope))
    return runner.floors[scope], runner.fabric.get(scope, "")


def _print(doc: dict, where: str) -> None:
    print(f"collectives {where}: backend {doc.get('backend')}, {doc.get('world')} rank(s), torch {doc.get('torch')}")
    print(floors.load_probe().table(doc))


def gpu_run(target) -> dict:
    """The probe over NCCL, one rank per GPU the host lists (run once per image)."""
    if "collectives.gpu" not in target.cache:
        _need_pytorch(target)
        cmd = (
            f"{target.python} {PROBE_DIR}/collectives.py --backend nccl --ranks {target.caps.gpu_count} "
            f"--max-bytes {GPU_MAX_BYTES}"
        )
        r = target.sh(cmd, timeout=900)
        lines = r.stdout.strip().splitlines()
        assert lines, f"`{cmd}` exited {r.rc} and printed nothing: {r.stderr.strip()[-1500:]}"
        target.cache["collectives.gpu"] = json.loads(lines[-1])
    return target.cache["collectives.gpu"]


def across_run(target, cluster) -> dict:
    """The probe over gloo across the cluster's containers, PER_HOST ranks each, node a the master."""
    if "collectives.across" not in target.cache:
        _need_pytorch(target)
        n = len(cluster.nodes)

        def node_cmd(i: int) -> str:
            return (
                f"{cluster.python} {PROBE_DIR}/collectives.py --backend gloo --nodes {n} --node-rank {i} "
                f"--master {cluster.hosts[0]} --port {ACROSS_PORT} --ranks {PER_HOST} "
                f"--max-bytes {ACROSS_MAX_BYTES}"
            )

        with ThreadPoolExecutor(n) as pool:
            runs = list(pool.map(lambda i: cluster.nodes[i].exec(node_cmd(i), timeout=600), range(n)))
        rank_docs = [
            json.loads(ln.split("TBCOLL ", 1)[1])
            for r in runs
            for ln in r.stdout.splitlines()
            if ln.startswith("TBCOLL ")
        ]
        doc: dict = floors.load_probe().merge(rank_docs) if rank_docs else {"errors": [], "world": 0}
        doc["errors"] += [
            f"node {h}: exit {r.returncode}: {(r.stderr or r.stdout).strip()[-600:]}"
            for h, r in zip(cluster.hosts, runs, strict=True)
            if r.returncode != 0 and not rank_docs
        ]
        target.cache["collectives.across"] = doc
    return target.cache["collectives.across"]


@pytest.mark.gpu
@pytest.mark.evidence("run")
def test_collectives_value_checked_on_every_local_gpu(target):
    """All-reduce, all-gather, reduce-scatter, all-to-all, broadcast (every root) and send/recv
    (every pair) over NCCL, one process per GPU the host lists, 8 B to 256 MiB: every element of
    every result right, and NCCL has every one of them."""
    doc = gpu_run(target)
    _print(doc, "on every local GPU")
    problems = floors.value_problems(doc, world=target.caps.gpu_count, every_collective=True)
    assert not problems, "NCCL collectives on every local GPU:\n" + "\n".join(problems)


@pytest.mark.gpu
@pytest.mark.evidence("run")
def test_collectives_busbw_meets_the_runners_floors_on_local_gpus(target):
    """Each floor the runner declares for its GPUs (floors.intra_node) is met: busbw at the
    floor's size at least the floor. Without a declaration: skipped, saying so."""
    declared, fabric = _runner("intra_node")
    doc = gpu_run(target)
    _print(doc, "on every local GPU")
    misses = floors.floor_misses(doc, declared, fabric)
    assert not misses, "below the runner's bandwidth floors:\n" + "\n".join(misses)


@pytest.mark.multinode
@pytest.mark.evidence("run")
def test_collectives_value_checked_across_containers(target, cluster):
    """The same six collectives over gloo/TCP between two containers, 2 ranks each, 8 B to 4 MiB:
    every element right; a collective gloo lacks is reported as unsupported, not failed."""
    doc = across_run(target, cluster)
    _print(doc, f"across {cluster.hosts}")
    problems = floors.value_problems(doc, world=PER_HOST * len(cluster.nodes), every_collective=False)
    assert not problems, f"collectives across {cluster.hosts}:\n" + "\n".join(problems)


@pytest.mark.multinode
@pytest.mark.evidence("run")
def test_collectives_busbw_meets_the_runners_floors_across_containers(target, cluster):
    """Each floor the runner declares between nodes (floors.inter_node) is met by the run across
    containers. Without a declaration: skipped, saying so."""
    declared, fabric = _runner("inter_node")
    doc = across_run(target, cluster)
    _print(doc, f"across {cluster.hosts}")
    misses = floors.floor_misses(doc, declared, fabric)
    assert not misses, "below the runner's bandwidth floors:\n" + "\n".join(misses)
