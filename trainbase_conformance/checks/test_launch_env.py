"""Launch environment: what a training script reads from the launcher under 2 containers x
2 ranks. Rank variables come from the manifest's MPI kind (OMPI_COMM_WORLD_* for Open MPI,
PMI_*/MPI_LOCAL* for Intel MPI). NODE_RANK is the node index, derived as
rank // local_size when ranks are placed by node -- not OMPI_COMM_WORLD_NODE_RANK, which is
the rank within a node."""

import pytest

from trainbase_conformance.fixtures import PROBE_DIR, tbconf_lines

PER_HOST = 2


@pytest.fixture(scope="module")
def rank_env(cluster):
    r = cluster.launch(PER_HOST, f"{PROBE_DIR}/rank_env.sh")
    assert r.returncode == 0, f"launch across {cluster.hosts} exited {r.returncode}: {r.stderr.strip()[-1500:]}"
    ranks = tbconf_lines(r.stdout)
    assert ranks, f"no rank printed anything: {r.stdout.strip()[-800:]}"
    return cluster, ranks


def _ints(cluster, env: dict) -> dict[str, int]:
    names = cluster.mpi.rank_vars
    missing = [v for v in names.values() if v not in env]
    assert not missing, f"rank on {env['host']} lacks {missing}: {env}"
    return {k: int(env[v]) for k, v in names.items()}


@pytest.mark.multinode
@pytest.mark.evidence("run")
def test_every_rank_sees_rank_variables(target, rank_env):
    """Each of the 4 ranks sees rank, size, local rank and local size, all consistent."""
    cluster, ranks = rank_env
    n = PER_HOST * len(cluster.hosts)
    assert len(ranks) == n, f"{len(ranks)} ranks reported, {n} launched: {ranks}"
    vals = [_ints(cluster, e) for e in ranks]
    assert sorted(v["rank"] for v in vals) == list(range(n)), f"ranks {[v['rank'] for v in vals]}"
    assert {v["size"] for v in vals} == {n}, f"world sizes {[v['size'] for v in vals]}"
    assert {v["local_size"] for v in vals} == {PER_HOST}, f"local sizes {[v['local_size'] for v in vals]}"
    for host in cluster.hosts:
        local = sorted(v["local_rank"] for e, v in zip(ranks, vals, strict=True) if e["host"] == host)
        assert local == list(range(PER_HOST)), f"local ranks on {host}: {local}"


@pytest.mark.multinode
@pytest.mark.evidence("run")
@pytest.mark.trainbase_contract("tb-launch")
def test_node_rank_is_node_index(target, rank_env):
    """rank // local_size is the index of the rank's node (ranks placed by node), and the image
    itself sets no NODE_RANK (one value baked in for every node)."""
    cluster, ranks = rank_env
    for env in ranks:
        v = _ints(cluster, env)
        node_index = cluster.hosts.index(env["host"])
        derived = v["rank"] // v["local_size"]
        assert derived == node_index, (
            f"rank {v['rank']} runs on {env['host']} (node {node_index}) but rank // local_size = {derived}"
        )
        assert v["local_rank"] == v["rank"] % v["local_size"], f"local rank {v['local_rank']} of rank {v['rank']}"
        # The launcher here (mpirun/mpiexec, no contract) sets no NODE_RANK: one that a rank sees
        # came from the image (ENV, a profile script) and is the same on every node, so wrong
        # on all but one; the contract (tb-launch, next test) is where NODE_RANK is set.
        assert "NODE_RANK" not in env, (
            f"rank {v['rank']} on {env['host']} (node {node_index}) sees NODE_RANK={env['NODE_RANK']} that no "
            "launcher set: the image sets it for every node"
        )


@pytest.mark.multinode
@pytest.mark.evidence("run")
@pytest.mark.trainbase_contract("tb-launch")
def test_launch_contract_node_rank(target, cluster):
    """The image's launch contract (`tb-launch`, declared by the manifest's components.launch
    or found on PATH) maps the launcher's variables to RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE and NODE_RANK = node index on every rank."""
    declared = target.components.get("launch")
    tool = (declared or {}).get("tool", "tb-launch") if isinstance(declared, dict) else "tb-launch"
    if target.sh(f"command -v {tool}").rc != 0:
        assert not declared, f"the manifest declares the launch contract {declared} but {tool} is not on PATH"
        pytest.skip(f"n/a: no {tool} in this image and the manifest declares no launch contract")
    hosts = ",".join(cluster.hosts)
    r = cluster.launch(PER_HOST, f"{tool} --hosts {hosts} {PROBE_DIR}/rank_env.sh")
    assert r.returncode == 0, f"{tool} under the launcher exited {r.returncode}: {r.stderr.strip()[-1500:]}"
    ranks = tbconf_lines(r.stdout)
    n = PER_HOST * len(cluster.hosts)
    assert len(ranks) == n, f"{len(ranks)} ranks reported, {n} launched: {r.stdout.strip()[-800:]}"
    for env in ranks:
        v = _ints(cluster, env)
        want = {
            "RANK": v["rank"],
            "WORLD_SIZE": n,
            "LOCAL_RANK": v["local_rank"],
            "LOCAL_WORLD_SIZE": PER_HOST,
            "NODE_RANK": cluster.hosts.index(env["host"]),
        }
        got = {k: int(env[k]) if k in env else None for k in want}
        assert got == want, f"rank on {env['host']}: {tool} set {got}, expected {want}"
