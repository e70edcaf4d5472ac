"""Multi-node: two containers on a private docker network, sshd started at test time with
host keys and a client key made for this test (no key comes from the image); the image's
launcher runs the value-checked allreduce across both, 2 ranks each. On an RDMA runner (the fabric
tier) the same allreduce must cross between the containers over InfiniBand/RoCE, with TCP taken
away from the MPI."""

import pytest

from trainbase_conformance.fixtures import PROBE_DIR, tbconf_lines

PER_HOST = 2


def _check(cluster, r, what: str) -> None:
    assert r.returncode == 0, (
        f"{what} across {cluster.hosts} exited {r.returncode}: {(r.stderr or r.stdout).strip()[-1500:]}"
    )
    ranks = tbconf_lines(r.stdout)
    n = PER_HOST * len(cluster.hosts)
    assert sorted(x["rank"] for x in ranks) == list(range(n)), f"{what}: ranks seen {ranks}"
    assert all(x["size"] == n and x["ok"] for x in ranks), f"{what}: wrong size or values: {ranks}"
    per_host = {h: sum(1 for x in ranks if x["host"] == h) for h in cluster.hosts}
    assert set(per_host.values()) == {PER_HOST}, f"{what}: ranks per host {per_host}"


@pytest.mark.multinode
@pytest.mark.evidence("run")
def test_multinode_mpicc_allreduce(target, cluster):
    """The C allreduce (mpicc in each container) across 2 containers x 2 ranks."""
    for node in cluster.nodes:
        r = node.exec(f"cd {PROBE_DIR} && mpicc -O2 -o allreduce allreduce.c")
        assert r.returncode == 0, f"mpicc on {node.hostname}: {r.stderr.strip()[-1000:]}"
    _check(cluster, cluster.launch(PER_HOST, f"{PROBE_DIR}/allreduce"), "mpicc allreduce")


@pytest.mark.multinode
@pytest.mark.evidence("run")
def test_multinode_mpi4py_allreduce(target, cluster):
    """The image's mpi4py allreduce across 2 containers x 2 ranks."""
    _check(cluster, cluster.launch(PER_HOST, f"{cluster.python} {PROBE_DIR}/allreduce_mpi4py.py"), "mpi4py allreduce")


@pytest.mark.multinode
@pytest.mark.evidence("run")
def test_multinode_mpi_exits_cleanly_under_heap_checks(target, cluster):
    """The mpi4py allreduce again, with glibc's heap checker preloaded into every rank: MPI
    finalize and the library destructors that run at exit must not free anything twice or free
    a pointer they do not own. Without the checker such a bug corrupts the heap silently and
    aborts only when a big library (torch) is loaded too; Intel MPI's libfabric once loaded its
    verbs provider twice (ldconfig had added a second name for it) and aborted every multi-node
    PyTorch/DeepSpeed job at exit, after the work had succeeded."""
    checked = f"env LD_PRELOAD=libc_malloc_debug.so.0 MALLOC_CHECK_=3 {cluster.python} {PROBE_DIR}/allreduce_mpi4py.py"
    _check(cluster, cluster.launch(PER_HOST, checked), "mpi4py allreduce under MALLOC_CHECK_=3")


@pytest.mark.multinode
@pytest.mark.evidence("run")
@pytest.mark.parametrize("python", ["python3", "python"])
def test_bare_python_on_every_rank_is_the_images_python(target, cluster, python):
    """`mpirun ... python3 train.py`, as users and Azure ML commands write it: on every rank of
    both containers the bare name must be the image's Python (the manifest's prefix, with its
    frameworks and mpi4py), not the distro's /usr/bin/python3. Ranks on the remote node get the
    environment the launcher builds over ssh, not the image's ENV: there a venv that is only on
    the local PATH is not found, and the job fails on node 2 only."""
    prefix = target.components["python"]["prefix"]
    code = "import socket, sys, mpi4py; print('TBPY', socket.gethostname(), sys.prefix, flush=True)"
    r = cluster.launch(PER_HOST, f'{python} -c "{code}"', timeout=120)
    seen = [ln.split()[1:3] for ln in r.stdout.splitlines() if ln.startswith("TBPY ")]
    assert r.returncode == 0 and len(seen) == PER_HOST * len(cluster.hosts), (
        f"`{python}` across {cluster.hosts} exited {r.returncode}, {len(seen)} ranks answered: "
        f"{(r.stderr or r.stdout).strip()[-1500:]}"
    )
    wrong = sorted({f"{host}: {pfx}" for host, pfx in seen if pfx != prefix})
    assert not wrong, f"bare `{python}` is not the image's Python ({prefix}) on: {', '.join(wrong)}"


# TCP taken away from each MPI kind, so that ranks on two nodes can only meet over the fabric.
# Open MPI: UCX as its only point-to-point layer, every UCX transport but TCP (shared memory and
# self stay, for ranks on one node; between nodes only rc/ud/dc over a verbs device remain).
# Intel MPI: libfabric's verbs provider only, and its startup line that names the provider.
OFF_TCP = {
    "openmpi": "--mca pml ucx -x UCX_TLS=^tcp",
    "intelmpi": "-genv I_MPI_OFI_PROVIDER verbs -genv I_MPI_DEBUG 1",
}


@pytest.mark.fabric
@pytest.mark.evidence("run")
def test_multinode_mpi_crosses_nodes_over_the_fabric(target, cluster):
    """The mpi4py allreduce across 2 containers x 2 ranks with TCP taken away from the MPI
    (OFF_TCP): the job must still run with every value right, so the bytes between the
    containers crossed over InfiniBand/RoCE. The ordinary run may fall back to TCP silently
    (UCX and libfabric both do when a device does not open): only this shows which one moved
    them. Intel MPI must also name verbs as its libfabric provider."""
    mpi = target.need_mpi()
    r = cluster.launch(PER_HOST, f"{OFF_TCP[mpi.kind]} {cluster.python} {PROBE_DIR}/allreduce_mpi4py.py")
    _check(cluster, r, f"mpi4py allreduce without TCP ({OFF_TCP[mpi.kind]})")
    if mpi.kind == "intelmpi":
        said = [ln.strip() for ln in (r.stdout + r.stderr).splitlines() if "libfabric provider:" in ln]
        assert said and all("verbs" in ln for ln in said), (
            f"Intel MPI does not name verbs as its libfabric provider: {said or (r.stdout + r.stderr).strip()[-800:]}"
        )
