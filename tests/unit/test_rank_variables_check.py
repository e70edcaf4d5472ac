"""The launch-environment check judged on fake ranks, so its failures are shown without a
cluster: a launcher that hands the ranks no local rank, or one that numbers the local ranks of a
node wrongly, must fail naming the rank and what it lacks; Open MPI's real variables pass."""

from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_launch_env

OMPI = {
    "rank": "OMPI_COMM_WORLD_RANK",
    "size": "OMPI_COMM_WORLD_SIZE",
    "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK",
    "local_size": "OMPI_COMM_WORLD_LOCAL_SIZE",
}
CLUSTER = SimpleNamespace(hosts=["node-a", "node-b"], mpi=SimpleNamespace(rank_vars=OMPI))


def _rank(host, rank, local, drop=()):
    env = {
        "host": host,
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local),
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    return {k: v for k, v in env.items() if k not in drop}


def test_ranks_without_a_local_rank_fail():
    """A wrapper launcher that starts the ranks with a clean environment of its own: no local rank."""
    ranks = [
        _rank(h, r, r % 2, drop=("OMPI_COMM_WORLD_LOCAL_RANK",)) for r, h in enumerate(["node-a"] * 2 + ["node-b"] * 2)
    ]
    with pytest.raises(AssertionError, match=r"rank on node-a lacks \['OMPI_COMM_WORLD_LOCAL_RANK'\]"):
        test_launch_env.test_every_rank_sees_rank_variables(None, (CLUSTER, ranks))


def test_local_ranks_numbered_wrongly_on_a_node_fail():
    ranks = [_rank("node-a", 0, 0), _rank("node-a", 1, 1), _rank("node-b", 2, 0), _rank("node-b", 3, 0)]
    with pytest.raises(AssertionError, match=r"local ranks on node-b: \[0, 0\]"):
        test_launch_env.test_every_rank_sees_rank_variables(None, (CLUSTER, ranks))


def test_open_mpi_s_variables_pass():
    ranks = [_rank("node-a", 0, 0), _rank("node-a", 1, 1), _rank("node-b", 2, 0), _rank("node-b", 3, 1)]
    test_launch_env.test_every_rank_sees_rank_variables(None, (CLUSTER, ranks))


def _four(**change) -> list[dict]:
    """The 4 healthy ranks, ``change`` (rank -> {variable: value}) applied."""
    ranks = [_rank("node-a", 0, 0), _rank("node-a", 1, 1), _rank("node-b", 2, 0), _rank("node-b", 3, 1)]
    for r, env in change.items():
        ranks[int(r[1:])].update(env)
    return ranks


@pytest.mark.parametrize(
    "ranks, message",
    [
        # one rank never printed (its node's launcher daemon died)
        (_four()[:3], r"3 ranks reported, 4 launched"),
        # two ranks told the same world rank
        (_four(r3={"OMPI_COMM_WORLD_RANK": "2"}), r"ranks \[0, 1, 2, 2\]"),
        # node-b's ranks in a world of their own
        (_four(r2={"OMPI_COMM_WORLD_SIZE": "2"}, r3={"OMPI_COMM_WORLD_SIZE": "2"}), r"world sizes \[4, 4, 2, 2\]"),
        # a launcher that counts every rank of the job as local
        (_four(**{f"r{i}": {"OMPI_COMM_WORLD_LOCAL_SIZE": "4"} for i in range(4)}), r"local sizes \[4, 4, 4, 4\]"),
    ],
    ids=["a-rank-missing", "rank-twice", "two-worlds", "local-size-of-the-job"],
)
def test_each_inconsistent_rank_variable_fails(ranks, message):
    with pytest.raises(AssertionError, match=message):
        test_launch_env.test_every_rank_sees_rank_variables(None, (CLUSTER, ranks))
