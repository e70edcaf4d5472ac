"""The launch contract shipped in every image (imagefs/opt/trainbase/lib/trainbase_launch.py):
each launcher's variables -> RANK, LOCAL_RANK, WORLD_SIZE, NODE_RANK, MASTER_*, TF_CONFIG."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from .conftest import ROOT

TOOL = ROOT / "imagefs" / "opt" / "trainbase" / "lib" / "trainbase_launch.py"
spec = importlib.util.spec_from_file_location("trainbase_launch", TOOL)
tl = importlib.util.module_from_spec(spec)
sys.modules["trainbase_launch"] = tl
spec.loader.exec_module(tl)


def ompi(rank, size=4, local_size=2, **extra):
    env = {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": size,
           "OMPI_COMM_WORLD_LOCAL_RANK": rank % local_size, "OMPI_COMM_WORLD_LOCAL_SIZE": local_size,
           # Open MPI's NODE_RANK is the rank WITHIN the node (0,1,0,1): the trap
           "OMPI_COMM_WORLD_NODE_RANK": rank % local_size}
    env.update(extra)
    return {k: str(v) for k, v in env.items()}


@pytest.mark.parametrize("rank, node", [(0, 0), (1, 0), (2, 1), (3, 1)])
def test_openmpi_two_nodes_node_rank_is_the_node_index(rank, node):
    w = tl.resolve(ompi(rank, MASTER_ADDR="10.1.0.4"))
    assert (w.launcher, w.rank, w.world_size, w.local_rank, w.local_world_size) == ("openmpi", rank, 4, rank % 2, 2)
    assert w.node_rank == node and w.nnodes == 2
    env = w.env()
    assert env["NODE_RANK"] == env["GROUP_RANK"] == str(node)
    assert env["MASTER_ADDR"] == "10.1.0.4" and env["MASTER_PORT"] == "29500"


def test_openmpi_node_rank_variable_is_never_used_as_node_index():
    env = ompi(3, MASTER_ADDR="h0")
    env["OMPI_COMM_WORLD_NODE_RANK"] = "1"  # the within-node rank of rank 3
    assert tl.resolve(env).node_rank == 1
    env["OMPI_COMM_WORLD_NODE_RANK"] = "0"
    assert tl.resolve(env).node_rank == 1


def test_ranks_mapped_by_node_are_refused_loudly():
    env = ompi(1, MASTER_ADDR="h0")
    env["OMPI_COMM_WORLD_LOCAL_RANK"] = "0"  # --map-by node: rank 1 is the first rank of node 1
    with pytest.raises(tl.LaunchError, match="not placed by node in blocks"):
        tl.resolve(env)


def test_uneven_ranks_per_node_are_refused():
    with pytest.raises(tl.LaunchError, match="do not split into nodes of 2"):
        tl.resolve(ompi(0, size=3, local_size=2, MASTER_ADDR="h0"))


@pytest.mark.parametrize("rank, node", [(0, 0), (3, 1)])
def test_intel_mpi_and_mpich_pmi(rank, node):
    env = {"PMI_RANK": str(rank), "PMI_SIZE": "4", "MPI_LOCALRANKID": str(rank % 2), "MPI_LOCALNRANKS": "2",
           "MASTER_ADDR": "h0"}
    w = tl.resolve(env)
    assert (w.launcher, w.rank, w.node_rank, w.local_rank, w.local_world_size) == ("pmi", rank, node, rank % 2, 2)


def test_pmi_without_local_rank_names_the_variable():
    with pytest.raises(tl.LaunchError, match="MPI_LOCALRANKID is not set"):
        tl.resolve({"PMI_RANK": "0", "PMI_SIZE": "2"})


def test_slurm_uses_its_node_id_and_nodelist():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_TASKS_PER_NODE": "2(x4)", "SLURM_JOB_NODELIST": "gpu[07-09],gpu11"}
    w = tl.resolve(env)
    assert (w.launcher, w.rank, w.node_rank, w.local_world_size, w.nnodes) == ("slurm", 5, 2, 2, 4)
    assert w.master_addr == "gpu07" and w.hosts == ("gpu07", "gpu08", "gpu09", "gpu11")
    tf = json.loads(w.env(tf=True)["TF_CONFIG"])
    assert tf["task"] == {"type": "worker", "index": 5}
    assert tf["cluster"]["worker"][5] == "gpu09:12346"


def test_slurm_uneven_tasks_per_node():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
           "SLURM_TASKS_PER_NODE": "2,1", "SLURM_JOB_NODELIST": "a,b"}
    with pytest.raises(tl.LaunchError, match="uneven tasks per node"):
        tl.resolve(env)


def test_torchrun_is_passed_through():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
           "TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": "node0", "MASTER_PORT": "23456"}
    w = tl.resolve(env)
    assert (w.launcher, w.node_rank, w.master_addr, w.master_port) == ("torchrun", 1, "node0", 23456)


def test_azure_ml_master_node_with_port():
    w = tl.resolve(ompi(2, AZ_BATCH_MASTER_NODE="10.0.0.4:6105"))
    assert (w.master_addr, w.master_port) == ("10.0.0.4", 6105)


def test_azure_ml_mpi_master_node_without_port():
    w = tl.resolve(ompi(2, AZ_BATCHAI_MPI_MASTER_NODE="10.0.0.5"))
    assert (w.master_addr, w.master_port) == ("10.0.0.5", 29500)


def test_multinode_without_master_address_names_what_is_missing():
    with pytest.raises(tl.LaunchError, match="no master address: set MASTER_ADDR.*AZ_BATCH_MASTER_NODE"):
        tl.resolve(ompi(0))


def test_single_node_mpi_defaults_to_loopback():
    w = tl.resolve(ompi(1, size=2, local_size=2))
    assert (w.master_addr, w.nnodes, w.node_rank) == ("127.0.0.1", 1, 0)


def test_no_launcher_is_a_single_process_world():
    w = tl.resolve({})
    assert (w.launcher, w.rank, w.world_size) == ("single", 0, 1)


def test_tf_config_needs_all_node_addresses():
    with pytest.raises(tl.LaunchError, match="TRAINBASE_HOSTS"):
        tl.resolve(ompi(0, MASTER_ADDR="h0")).env(tf=True)
    w = tl.resolve(ompi(3, MASTER_ADDR="a", TRAINBASE_HOSTS="a,b"))
    tf = json.loads(w.env(tf=True)["TF_CONFIG"])
    assert tf["cluster"]["worker"] == ["a:12345", "a:12346", "b:12345", "b:12346"] and tf["task"]["index"] == 3


def test_lightning_defaults_match_the_launch():
    env = tl.resolve(ompi(0, MASTER_ADDR="h0")).env()
    assert env["PL_TRAINER_DEVICES"] == "2" and env["PL_TRAINER_NUM_NODES"] == "2"
    # what Lightning's TorchElasticEnvironment needs to detect the launch and read the world
    assert env["TORCHELASTIC_RUN_ID"] and env["GROUP_RANK"] == "0" and env["LOCAL_WORLD_SIZE"] == "2"


@pytest.mark.parametrize("launch", [ompi(3, MASTER_ADDR="h0"),
                                    {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
                                    {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
                                     "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "2"}], ids=["openmpi", "pmi", "slurm"])
def test_every_mpi_launch_is_marked_as_torchelastic_for_lightning(launch):
    assert tl.resolve(launch).env()["TORCHELASTIC_RUN_ID"] == "trainbase"


def test_torchrun_run_id_is_kept_and_a_lone_process_gets_none():
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
                "TORCHELASTIC_RUN_ID": "job-42"}
    assert tl.resolve(torchrun).env()["TORCHELASTIC_RUN_ID"] == "job-42"
    # alone, Lightning may spawn its own workers: marking it torchelastic would forbid that
    assert "TORCHELASTIC_RUN_ID" not in tl.resolve({}).env()


def test_non_integer_values_are_named():
    env = ompi(0, MASTER_ADDR="h")
    env["OMPI_COMM_WORLD_SIZE"] = "four"
    with pytest.raises(tl.LaunchError, match="OMPI_COMM_WORLD_SIZE='four' is not an integer"):
        tl.resolve(env)


@pytest.mark.parametrize("expr, hosts", [
    ("n1", ["n1"]), ("n[1-3]", ["n1", "n2", "n3"]), ("gpu[01-02,10],cpu7", ["gpu01", "gpu02", "gpu10", "cpu7"]),
])
def test_slurm_hostlist(expr, hosts):
    assert tl.expand_hostlist(expr) == hosts


def _cli(args, env):
    return subprocess.run([sys.executable, str(TOOL), *args], env={"PATH": os.environ["PATH"], **env},
                          capture_output=True, text=True)


def test_cli_export_is_eval_able():
    r = _cli(["--export"], ompi(2, MASTER_ADDR="h0"))
    assert r.returncode == 0
    out = subprocess.run(["bash", "-c", r.stdout + "\necho $RANK $NODE_RANK $LOCAL_RANK $WORLD_SIZE $MASTER_ADDR"],
                         capture_output=True, text=True).stdout.split()
    assert out == ["2", "1", "0", "4", "h0"]


def test_cli_wraps_a_command_with_the_mapped_env():
    r = _cli(["--", sys.executable, "-c", "import os; print(os.environ['RANK'], os.environ['NODE_RANK'])"],
             ompi(3, MASTER_ADDR="h0"))
    assert r.returncode == 0 and r.stdout.split() == ["3", "1"]


def test_cli_failure_is_one_line_and_exit_2():
    r = _cli(["--export"], ompi(0))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("tb-launch: error: multi-node job (2 nodes) but no master address")
