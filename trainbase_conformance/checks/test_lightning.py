"""Lightning: which world the Trainer takes under each way it is started -- no launcher (its own
world of 1), mpirun + tb-launch (the contract's variables), and Azure ML's walkthrough recipes
without tb-launch (MPI's world, patched in the image to be devices x num_nodes) -- and that a
mismatch between `devices` and the launch stops every rank, fast, naming the fix. The scripts
are examples/lightning_ddp.py and examples/lightning_azureml.py."""

from __future__ import annotations

import re

import pytest

from trainbase_conformance.checks.test_frameworks import EX, need, ok_lines, pinned, put_examples, trained


def one_world(ranks: list[dict[str, str]], n: int, what: str = "") -> None:
    """Ranks 0..n-1 trained, each in the same world of n, with one set of parameters."""
    trained(ranks, n)
    assert {x["world"] for x in ranks} == {str(n)} and len({x["params"] for x in ranks}) == 1, (
        f"want one world of {n} {what}with one set of parameters: {ranks}"
    )


def took_the_world_from(ranks: list[dict[str, str]], env: str, why: str) -> None:
    """Every rank's Trainer took its world from Lightning's ``env`` cluster environment."""
    assert {x["env"] for x in ranks} == {env}, f"{why} ({env}): {ranks}"


def need_lightning(target) -> str:
    need(target, "pytorch")
    version = pinned(target, "pytorch").get("lightning")
    if not version:
        pytest.skip(f"{target.name} has no Lightning")
    return version


@pytest.mark.cpu
@pytest.mark.evidence("run")
def test_lightning_example_runs_as_one_process_without_a_launcher(target):
    """`python lightning_ddp.py` with no launcher (how a user tries a node first): Lightning
    starts its own world (devices x nodes) and the example must accept it and train."""
    need_lightning(target)
    put_examples(target.container)
    r = target.sh(f"{target.python} {EX}/lightning_ddp.py --steps 2", timeout=300)
    assert r.rc == 0, (r.stdout + r.stderr)[-2000:]
    lines = ok_lines(r.stdout)
    assert len(lines) == 1, f"one process, one OK line; got {lines}: {r.stdout[-1500:]}"
    assert lines[0]["world"] == "1" and lines[0]["env"] == "LightningEnvironment", (
        f"without a launcher Lightning must train a world of 1 in its own LightningEnvironment: {lines[0]}"
    )


@pytest.mark.multinode
@pytest.mark.evidence("run")
@pytest.mark.trainbase_contract("tb-launch")
def test_lightning_ddp_per_process_mpirun_with_the_contract(cluster, target):
    """Lightning DDP, 2 processes on 2 containers under mpirun + tb-launch: Lightning sees the
    launcher's world through the contract (not 2 independent jobs) and the parameters agree."""
    need_lightning(target)
    put_examples(*cluster.nodes)
    r = cluster.launch(
        1, f"env MASTER_ADDR=a MASTER_PORT=29514 tb-launch {cluster.python} {EX}/lightning_ddp.py", timeout=300
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ranks = ok_lines(r.stdout)
    one_world(ranks, 2)
    assert {(x["rank"], x["node_rank"]) for x in ranks} == {("0", "0"), ("1", "1")}, (
        f"want rank 0 on node 0 and rank 1 on node 1: {ranks}"
    )
    took_the_world_from(ranks, "TorchElasticEnvironment", "Lightning must take the world from the contract's variables")


@pytest.mark.multinode
@pytest.mark.evidence("run")
@pytest.mark.trainbase_contract("tb-launch")
def test_lightning_devices_mismatch_fails_loudly_on_every_rank(cluster, target):
    """The trap: `devices` that differs from the ranks per node left one rank failing and rank 0
    hanging. Under the contract every rank must stop, fast, with Lightning's reason."""
    need_lightning(target)
    put_examples(*cluster.nodes)
    r = cluster.launch(
        1,
        f"env MASTER_ADDR=a MASTER_PORT=29515 tb-launch {cluster.python} {EX}/lightning_ddp.py --devices 2",
        timeout=150,
    )
    assert r.returncode not in (0, 124), f"exit {r.returncode} (124: hung until killed)\n" + r.stdout[-1500:]
    out = r.stdout + r.stderr
    assert "does not match the world size" in out, out[-2000:]
    assert not ok_lines(r.stdout), "a rank trained although devices did not match the launch"


def _azureml_recipe(cluster, per_host: int, args: str, port: int):
    """examples/lightning_azureml.py across the 2 containers, as the Azure ML walkthrough runs
    it: plain mpirun, no tb-launch; AZ_BATCHAI_MPI_MASTER_NODE as Azure ML sets it."""
    put_examples(*cluster.nodes)
    r = cluster.launch(
        per_host,
        f"env AZ_BATCHAI_MPI_MASTER_NODE=a {cluster.python} {EX}/lightning_azureml.py {args} --master-port {port}",
        timeout=300,
    )
    fails = [m.group(1) for m in re.finditer(r"\bFAIL rank=\S+ reason=(.*)", r.stdout)]
    return r, ok_lines(r.stdout), fails


@pytest.mark.multinode
@pytest.mark.evidence("run")
@pytest.mark.trainbase_contract("the manifest's framework_packages")
def test_lightning_azureml_per_node_recipe_trains_the_full_world(cluster, target):
    """Per node (process_count_per_node=1; the script sets MASTER_ADDR, MASTER_PORT and NODE_RANK,
    then Trainer(devices=2, num_nodes=2)): 4 processes train, identical parameters. Unpatched,
    Lightning took MPI's world of 2 (mpi4py is in the image) and exited 0 with half the devices."""
    need_lightning(target)
    r, ranks, fails = _azureml_recipe(cluster, 1, "per-node --devices 2 --num-nodes 2", 29516)
    assert r.returncode == 0 and not fails, f"exit {r.returncode}, {fails}\n" + r.stdout[-2000:] + r.stderr[-1500:]
    one_world(ranks, 4, "(devices x num_nodes) ")
    places = sorted((x["node_rank"], x["local_rank"]) for x in ranks)
    assert places == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")], (
        f"(node rank, local rank) {places}: want 2 processes on each of the 2 nodes"
    )


@pytest.mark.multinode
@pytest.mark.evidence("run")
@pytest.mark.trainbase_contract("the manifest's framework_packages")
def test_lightning_azureml_per_process_recipe_without_tb_launch(cluster, target):
    """Per process without tb-launch (process_count_per_node=devices): Lightning's MPI
    environment sees the launcher's world of 4, identical parameters."""
    need_lightning(target)
    r, ranks, fails = _azureml_recipe(cluster, 2, "per-process --devices 2 --num-nodes 2", 29517)
    assert r.returncode == 0 and not fails, f"exit {r.returncode}, {fails}\n" + r.stdout[-2000:] + r.stderr[-1500:]
    one_world(ranks, 4)
    took_the_world_from(ranks, "MPIEnvironment", "without tb-launch Lightning must take the launcher's world from MPI")


@pytest.mark.multinode
@pytest.mark.evidence("run")
@pytest.mark.trainbase_contract("the manifest's framework_packages")
def test_lightning_azureml_per_process_mismatch_stops_with_the_fix(cluster, target):
    """Per process without tb-launch but one rank a node for devices=2: the MPI world (2) cannot
    be devices x num_nodes (4). Every rank must stop before training, fast, naming the fix;
    unpatched, one rank raised and the other hung until killed."""
    need_lightning(target)
    r, ranks, fails = _azureml_recipe(cluster, 1, "per-process --devices 2 --num-nodes 2", 29518)
    assert r.returncode not in (0, 124), f"exit {r.returncode} (124: hung until killed)\n" + r.stdout[-1500:]
    assert not ranks, f"processes trained on a world that is not devices x num_nodes: {ranks}"
    assert fails and all("process_count_per_node=2" in f and "NODE_RANK" in f for f in fails), (
        f"no rank named the fix: {fails or (r.stdout + r.stderr)[-2000:]}"
    )
