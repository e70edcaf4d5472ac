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
sys.path.insert(0, str(TOOL.parent))  # its helper modules, as trainbase.pth puts them on the image's path
spec = importlib.util.spec_from_file_location("trainbase_launch", TOOL)
tl = importlib.util.module_from_spec(spec)
sys.modules["trainbase_launch"] = tl
spec.loader.exec_module(tl)


def ompi(rank, size=4, local_size=2, **extra):
    env = {
        "OMPI_COMM_WORLD_RANK": rank,
        "OMPI_COMM_WORLD_SIZE": size,
        "OMPI_COMM_WORLD_LOCAL_RANK": rank % local_size,
        "OMPI_COMM_WORLD_LOCAL_SIZE": local_size,
        # Open MPI's NODE_RANK is the rank WITHIN the node (0,1,0,1): the trap
        "OMPI_COMM_WORLD_NODE_RANK": rank % local_size,
    }
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
    env = {
        "PMI_RANK": str(rank),
        "PMI_SIZE": "4",
        "MPI_LOCALRANKID": str(rank % 2),
        "MPI_LOCALNRANKS": "2",
        "MASTER_ADDR": "h0",
    }
    w = tl.resolve(env)
    assert (w.launcher, w.rank, w.node_rank, w.local_rank, w.local_world_size) == ("pmi", rank, node, rank % 2, 2)


def test_pmi_without_local_rank_names_the_variable():
    with pytest.raises(tl.LaunchError, match="MPI_LOCALRANKID is not set"):
        tl.resolve({"PMI_RANK": "0", "PMI_SIZE": "2"})


def test_slurm_uses_its_node_id_and_nodelist():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2",
        "SLURM_TASKS_PER_NODE": "2(x4)",
        "SLURM_JOB_NODELIST": "gpu[07-09],gpu11",
    }
    w = tl.resolve(env)
    assert (w.launcher, w.rank, w.node_rank, w.local_world_size, w.nnodes) == ("slurm", 5, 2, 2, 4)
    assert w.master_addr == "gpu07" and w.hosts == ("gpu07", "gpu08", "gpu09", "gpu11")
    tf = json.loads(w.env(tf=True)["TF_CONFIG"])
    assert tf["task"] == {"type": "worker", "index": 5}
    assert tf["cluster"]["worker"][5] == "gpu09:12346"


def test_slurm_uneven_tasks_per_node():
    env = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "3",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_TASKS_PER_NODE": "2,1",
        "SLURM_JOB_NODELIST": "a,b",
    }
    with pytest.raises(tl.LaunchError, match="uneven tasks per node"):
        tl.resolve(env)


def test_torchrun_is_passed_through():
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "TORCHELASTIC_RUN_ID": "x",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "23456",
    }
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


@pytest.mark.parametrize(
    "launch",
    [
        ompi(3, MASTER_ADDR="h0"),
        {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
        {
            "SLURM_PROCID": "0",
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURM_TASKS_PER_NODE": "2",
        },
    ],
    ids=["openmpi", "pmi", "slurm"],
)
def test_every_mpi_launch_is_marked_as_torchelastic_for_lightning(launch):
    assert tl.resolve(launch).env()["TORCHELASTIC_RUN_ID"] == "trainbase"


def test_torchrun_run_id_is_kept_and_a_lone_process_gets_none():
    torchrun = {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "TORCHELASTIC_RUN_ID": "job-42",
    }
    assert tl.resolve(torchrun).env()["TORCHELASTIC_RUN_ID"] == "job-42"
    # alone, Lightning may spawn its own workers: marking it torchelastic would forbid that
    assert "TORCHELASTIC_RUN_ID" not in tl.resolve({}).env()


def test_non_integer_values_are_named():
    env = ompi(0, MASTER_ADDR="h")
    env["OMPI_COMM_WORLD_SIZE"] = "four"
    with pytest.raises(tl.LaunchError, match="OMPI_COMM_WORLD_SIZE='four' is not an integer"):
        tl.resolve(env)


@pytest.mark.parametrize(
    "expr, hosts",
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("gpu[01-02,10],cpu7", ["gpu01", "gpu02", "gpu10", "cpu7"]),
    ],
)
def test_slurm_hostlist(expr, hosts):
    assert tl.expand_hostlist(expr) == hosts


def _cli(args, env):
    return subprocess.run(
        [sys.executable, str(TOOL), *args],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_cli_export_is_eval_able():
    r = _cli(["--export"], ompi(2, MASTER_ADDR="h0"))
    assert r.returncode == 0
    out = subprocess.run(
        ["bash", "-c", r.stdout + "\necho $RANK $NODE_RANK $LOCAL_RANK $WORLD_SIZE $MASTER_ADDR"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert out == ["2", "1", "0", "4", "h0"]


def test_cli_wraps_a_command_with_the_mapped_env():
    r = _cli(
        ["--", sys.executable, "-c", "import os; print(os.environ['RANK'], os.environ['NODE_RANK'])"],
        ompi(3, MASTER_ADDR="h0"),
    )
    assert r.returncode == 0 and r.stdout.split() == ["3", "1"]


def test_cli_failure_is_one_line_and_exit_2():
    r = _cli(["--export"], ompi(0))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("tb-launch: error: multi-node job (2 nodes) but no master address")


# ============================================================================ every launch mode
# One table per mode: the exact environment each of the 4 processes of a 2-node x 2-process job
# gets (Azure ML guides: how-to-train-distributed-gpu v1/v2, Batch compute-node variables; Slurm's
# srun task environment), and everything tb-launch must export for it. A partial or conflicting
# environment either resolves to the real 2 x 2 topology or raises LaunchError naming the
# variable: never a KeyError, never a silently wrong rank.
N0, N1 = "10.0.0.4", "10.0.0.5"
AZ_BATCH = {
    "AZ_BATCH_MASTER_NODE": f"{N0}:6000",
    "AZ_BATCHAI_MPI_MASTER_NODE": N0,
    "AZ_BATCH_HOST_LIST": f"{N0},{N1}",
    "AZ_BATCH_NODE_LIST": f"{N0};{N1}",
}
CONTRACT = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "NNODES",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PL_TRAINER_NUM_NODES",
    "PL_TRAINER_DEVICES",
)


REAL_LOCAL_ADDRESSES = tl._local_addresses


@pytest.fixture(autouse=True)
def _not_on_an_azure_node(monkeypatch):
    """The node-order check of AZ_BATCH_HOST_LIST looks for this machine's own address."""
    monkeypatch.setattr(tl, "_local_addresses", lambda hosts: set())


def s(d):
    return {k: str(v) for k, v in d.items()}


def want_2x2(rank, master=N0, port=6000):
    node = rank // 2
    return s(
        {
            "RANK": rank,
            "WORLD_SIZE": 4,
            "LOCAL_RANK": rank % 2,
            "LOCAL_WORLD_SIZE": 2,
            "NODE_RANK": node,
            "GROUP_RANK": node,
            "NNODES": 2,
            "MASTER_ADDR": master,
            "MASTER_PORT": port,
            "PL_TRAINER_NUM_NODES": 2,
            "PL_TRAINER_DEVICES": 2,
        }
    )


def exported(env, tf=False):
    out = tl.resolve(env).env(tf=tf)
    return {k: out[k] for k in CONTRACT if k in out}, out


def tf_workers(*hosts, port=12345):
    return [f"{h}:{port + i}" for h in hosts for i in range(2)]


# --- Azure ML `type: mpi`, Open MPI: Azure ML runs mpirun itself
AZURE_MPI_OPENMPI = [
    s(
        {
            "OMPI_COMM_WORLD_RANK": r,
            "OMPI_COMM_WORLD_SIZE": 4,
            "OMPI_COMM_WORLD_LOCAL_RANK": r % 2,
            "OMPI_COMM_WORLD_LOCAL_SIZE": 2,
            "OMPI_COMM_WORLD_NODE_RANK": r % 2,
            **AZ_BATCH,
        }
    )
    for r in range(4)
]
# --- Azure ML `type: mpi` on an Intel MPI image: Hydra's PMI_* and MPI_LOCAL*
AZURE_MPI_INTEL = [
    s(
        {
            "PMI_RANK": r,
            "PMI_SIZE": 4,
            "MPI_LOCALRANKID": r % 2,
            "MPI_LOCALNRANKS": 2,
            "I_MPI_HYDRA_TOPOLIB": "hwloc",
            **AZ_BATCH,
        }
    )
    for r in range(4)
]


@pytest.mark.parametrize("table", [AZURE_MPI_OPENMPI, AZURE_MPI_INTEL], ids=["openmpi", "intelmpi"])
@pytest.mark.parametrize("rank", range(4))
def test_azureml_type_mpi_table(table, rank):
    got, out = exported(table[rank], tf=True)
    assert got == want_2x2(rank)
    tf = json.loads(out["TF_CONFIG"])
    # --tf takes every node's address from Azure's AZ_BATCH_HOST_LIST: no TRAINBASE_HOSTS needed
    assert tf == {"cluster": {"worker": tf_workers(N0, N1)}, "task": {"type": "worker", "index": rank}}


def test_azureml_type_mpi_node_list_alone_gives_the_tf_hosts():
    env = dict(AZURE_MPI_OPENMPI[3])
    del env["AZ_BATCH_HOST_LIST"]
    assert json.loads(tl.resolve(env).env(tf=True)["TF_CONFIG"])["cluster"]["worker"] == tf_workers(N0, N1)


def test_azureml_host_list_in_another_order_than_the_ranks_is_refused(monkeypatch):
    # node 0 (ranks 0, 1) finds its own address second in AZ_BATCH_HOST_LIST: a TF_CONFIG built
    # from that list would send worker 0's peers to node 1
    monkeypatch.setattr(tl, "_local_addresses", lambda hosts: {N1})
    with pytest.raises(tl.LaunchError, match=f"AZ_BATCH_HOST_LIST.*{N1}.*NODE_RANK.*0"):
        tl.resolve(AZURE_MPI_OPENMPI[0]).env(tf=True)
    monkeypatch.setattr(tl, "_local_addresses", lambda hosts: {N0})
    assert json.loads(tl.resolve(AZURE_MPI_OPENMPI[1]).env(tf=True)["TF_CONFIG"])["task"]["index"] == 1


def test_azureml_type_mpi_with_more_hosts_than_nodes_names_the_list():
    env = dict(AZURE_MPI_OPENMPI[0], AZ_BATCH_HOST_LIST=f"{N0},{N1},10.0.0.6")
    with pytest.raises(tl.LaunchError, match="AZ_BATCH_HOST_LIST"):
        tl.resolve(env).env(tf=True)


# --- Azure ML `type: pytorch`: Azure starts process_count_per_instance processes per node itself and
# sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE, NODE_RANK per node, RANK, LOCAL_RANK per process;
# no LOCAL_WORLD_SIZE. Whether AmlCompute adds its Batch variables there is not documented:
# each node-count source is tried alone.
def azure_pytorch(rank, per_node=2, nodes=2, **extra):
    return s(
        {
            "MASTER_ADDR": N0,
            "MASTER_PORT": 6105,
            "WORLD_SIZE": per_node * nodes,
            "NODE_RANK": rank // per_node,
            "RANK": rank,
            "LOCAL_RANK": rank % per_node,
            **extra,
        }
    )


NODE_COUNT = {
    "batch": AZ_BATCH,
    "host-list": {"AZ_BATCH_HOST_LIST": f"{N0},{N1}"},
    "node-list": {"AZ_BATCH_NODE_LIST": f"{N0};{N1}"},
    "azureml": {"AZUREML_NODE_COUNT": "2"},
    "ccp": {"CCP_NODES": f"2 {N0} 2 {N1} 2"},
}
AZURE_PYTORCH = {src: [azure_pytorch(r, **extra) for r in range(4)] for src, extra in NODE_COUNT.items()}


@pytest.mark.parametrize("src", NODE_COUNT)
@pytest.mark.parametrize("rank", range(4))
def test_azureml_type_pytorch_table(src, rank):
    got, out = exported(AZURE_PYTORCH[src][rank])
    assert got == want_2x2(rank, port=6105)
    assert out["TORCHELASTIC_RUN_ID"] == "trainbase"


@pytest.mark.parametrize("rank", range(4))
def test_azureml_type_pytorch_without_a_node_count_is_left_as_azure_set_it(rank):
    # node 0 cannot tell 2 x 2 from 1 x 4: nothing is invented (no LOCAL_WORLD_SIZE, NNODES,
    # Lightning defaults), on every node alike, and the job runs as it would without tb-launch
    _, out = exported(azure_pytorch(rank))
    assert out == s(
        {
            "RANK": rank,
            "WORLD_SIZE": 4,
            "LOCAL_RANK": rank % 2,
            "NODE_RANK": rank // 2,
            "GROUP_RANK": rank // 2,
            "MASTER_ADDR": N0,
            "MASTER_PORT": 6105,
            "TRAINBASE_LAUNCHER": "env",
        }
    )


@pytest.mark.parametrize(
    "env, match",
    [
        (azure_pytorch(2, NODE_RANK=0, **AZ_BATCH), "RANK=2.*NODE_RANK=0"),  # NODE_RANK of another node
        (azure_pytorch(0, NODE_RANK=1), "RANK=0.*LOCAL_RANK=0.*NODE_RANK=1"),  # same, no node count
        (azure_pytorch(1, AZ_BATCH_HOST_LIST=f"{N0},{N1},10.0.0.6"), "WORLD_SIZE=4.*AZ_BATCH_HOST_LIST.*3"),
        (
            azure_pytorch(1, AZUREML_NODE_COUNT="3", AZ_BATCH_HOST_LIST=f"{N0},{N1}"),
            "AZ_BATCH_HOST_LIST.*AZUREML_NODE_COUNT",
        ),
        (azure_pytorch(1, CCP_NODES="two"), "CCP_NODES"),
        (azure_pytorch(1, MASTER_PORT="http"), "MASTER_PORT='http'"),
        ({k: v for k, v in azure_pytorch(1, **AZ_BATCH).items() if k != "LOCAL_RANK"}, "LOCAL_RANK is not set"),
        ({k: v for k, v in azure_pytorch(2).items() if k != "WORLD_SIZE"}, "WORLD_SIZE is not set"),
        ({k: v for k, v in azure_pytorch(2).items() if k != "MASTER_ADDR"}, "no master address.*MASTER_ADDR"),
    ],
    ids=[
        "node-rank-vs-rank",
        "node-rank-vs-rank-no-count",
        "world-vs-host-list",
        "two-node-counts",
        "ccp-garbage",
        "master-port",
        "no-local-rank",
        "no-world-size",
        "no-master",
    ],
)
def test_azureml_type_pytorch_conflicting_and_partial(env, match):
    with pytest.raises(tl.LaunchError, match=match):
        tl.resolve(env)


def test_azureml_type_pytorch_without_node_rank_derives_it_from_the_node_count():
    env = {k: v for k, v in azure_pytorch(3, **AZ_BATCH).items() if k != "NODE_RANK"}
    assert exported(env)[0] == want_2x2(3, port=6105)


# --- Azure ML `type: pytorch` per node: process_count_per_instance=1, the command is torchrun
AZURE_PER_NODE = [azure_pytorch(n, per_node=1, **AZ_BATCH) for n in range(2)]
# ... and what torchrun --nproc-per-node 2 --node-rank $NODE_RANK gives its workers on top of it
TORCHRUN_WORKERS = [
    s(
        {
            **AZURE_PER_NODE[r // 2],
            "RANK": r,
            "WORLD_SIZE": 4,
            "LOCAL_RANK": r % 2,
            "LOCAL_WORLD_SIZE": 2,
            "GROUP_RANK": r // 2,
            "ROLE_RANK": r,
            "ROLE_WORLD_SIZE": 4,
            "TORCHELASTIC_RUN_ID": "none",
            "TORCHELASTIC_RESTART_COUNT": 0,
        }
    )
    for r in range(4)
]


@pytest.mark.parametrize("node", range(2))
def test_azureml_pytorch_per_node_table(node):
    got, _ = exported(AZURE_PER_NODE[node])
    assert got == s(
        {
            "RANK": node,
            "WORLD_SIZE": 2,
            "LOCAL_RANK": 0,
            "LOCAL_WORLD_SIZE": 1,
            "NODE_RANK": node,
            "GROUP_RANK": node,
            "NNODES": 2,
            "MASTER_ADDR": N0,
            "MASTER_PORT": 6105,
            "PL_TRAINER_NUM_NODES": 2,
            "PL_TRAINER_DEVICES": 1,
        }
    )


@pytest.mark.parametrize("rank", range(4))
def test_azureml_pytorch_per_node_torchrun_workers_table(rank):
    got, out = exported(TORCHRUN_WORKERS[rank])
    assert got == want_2x2(rank, port=6105) and out["TORCHELASTIC_RUN_ID"] == "none"


def _fake_torchrun(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "torchrun").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}))\n"
    )
    (bin_ / "torchrun").chmod(0o755)
    return {"PATH": f"{bin_}:{os.environ['PATH']}"}


@pytest.mark.parametrize("extra", [AZ_BATCH, {}], ids=["with-batch-vars", "without"])
@pytest.mark.parametrize("node", range(2))
def test_cli_torchrun_on_the_per_node_environment(tmp_path, node, extra):
    env = {**azure_pytorch(node, per_node=1, **extra), **_fake_torchrun(tmp_path)}
    r = subprocess.run(
        [sys.executable, str(TOOL), "torchrun", "--nproc-per-node", "2", "train.py"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)["env"]
    assert (seen["NODE_RANK"], seen["MASTER_ADDR"], seen["MASTER_PORT"]) == (str(node), N0, "6105")
    assert seen.get("NNODES", "2") == "2"
    # what torchrun itself reads (its options' PET_* variables): NNODES/NODE_RANK alone left it
    # at --nnodes 1, and each node trained as a world of its own (seen in the azureml tier)
    assert {k: seen.get(k) for k in ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")} == {
        "PET_NNODES": "2",
        "PET_NODE_RANK": str(node),
        "PET_MASTER_ADDR": N0,
        "PET_MASTER_PORT": "6105",
    }
    # torchrun starts nproc-per-node workers: a per-node "devices 1" default would make
    # Lightning refuse the 4-process world torchrun builds
    assert "PL_TRAINER_DEVICES" not in seen


def test_cli_torchrun_keeps_its_own_options_and_refuses_one_agent_per_process(tmp_path):
    env = {**azure_pytorch(1, per_node=1, **AZ_BATCH), **_fake_torchrun(tmp_path), "PET_MASTER_PORT": "29400"}
    r = subprocess.run(
        [sys.executable, str(TOOL), "torchrun", "train.py"], env=env, capture_output=True, text=True, check=False
    )
    assert json.loads(r.stdout)["env"]["PET_MASTER_PORT"] == "29400"
    # `type: pytorch` with 2 processes a node and torchrun as the command: 2 agents a node
    env = {**azure_pytorch(3, **AZ_BATCH), "PATH": env["PATH"]}
    r = subprocess.run(
        [sys.executable, str(TOOL), "torchrun", "train.py"], env=env, capture_output=True, text=True, check=False
    )
    assert r.returncode == 2 and "once a node" in r.stderr and "LOCAL_WORLD_SIZE=2" in r.stderr, r.stderr


# --- Azure ML `type: tensorflow`: Azure writes TF_CONFIG per worker (here 2 workers a node)
def azure_tf(index, workers=None, task="worker", **extra):
    cfg = {"cluster": {"worker": workers or tf_workers(N0, N1, port=2222)}, "task": {"type": task, "index": index}}
    return s({"TF_CONFIG": json.dumps(cfg), **extra})


AZURE_TF = [azure_tf(r) for r in range(4)]


@pytest.mark.parametrize("extra", [{}, AZ_BATCH], ids=["tf-config-only", "with-batch-vars"])
@pytest.mark.parametrize("rank", range(4))
def test_azureml_type_tensorflow_table(rank, extra):
    env = {**AZURE_TF[rank], **extra}
    got, out = exported(env, tf=True)
    # the master is worker 0's host (TF_CONFIG is the truth), not AZ_BATCH_MASTER_NODE's
    assert got == want_2x2(rank, port=29500)
    assert out["TF_CONFIG"] == env["TF_CONFIG"]  # Azure's, byte for byte: never replaced
    assert "TF_CONFIG" not in exported(env)[1]  # without --tf, left alone in the environment


def test_tf_config_with_a_chief_counts_it_as_rank_0():
    cfg = {
        "cluster": {"chief": [f"{N0}:2222"], "worker": [f"{N0}:2223", f"{N1}:2222", f"{N1}:2223"]},
        "task": {"type": "worker", "index": 0},
    }
    w = tl.resolve({"TF_CONFIG": json.dumps(cfg)})
    assert (w.rank, w.world_size, w.local_rank, w.node_rank, w.nnodes) == (1, 4, 1, 0, 2)


@pytest.mark.parametrize(
    "env, match",
    [
        (azure_tf(1, RANK="0", WORLD_SIZE="4", LOCAL_RANK="0"), "TF_CONFIG.*rank 1.*RANK=0"),
        (
            {**azure_tf(0, workers=["localhost:12345"]), **AZURE_MPI_OPENMPI[1]},
            "TF_CONFIG.*1 worker.*OMPI_COMM_WORLD_SIZE=4",
        ),
        (azure_tf(0, AZ_BATCH_HOST_LIST=f"{N0},{N1},10.0.0.6"), "TF_CONFIG.*2 hosts.*AZ_BATCH_HOST_LIST.*3"),
        (s({"TF_CONFIG": "{cluster: worker}"}), "TF_CONFIG is not JSON"),
        (azure_tf(4), "TF_CONFIG.*index 4"),
        (s({"TF_CONFIG": json.dumps({"task": {"type": "worker", "index": 0}})}), "TF_CONFIG.*no cluster"),
    ],
    ids=["rank", "world-vs-mpi", "hosts-vs-batch", "not-json", "index", "no-cluster"],
)
def test_tf_config_conflicting_and_partial(env, match):
    with pytest.raises(tl.LaunchError, match=match):
        tl.resolve(env)


def test_tf_config_agreeing_with_mpi_is_kept_under_tf():
    env = {**AZURE_MPI_OPENMPI[2], **azure_tf(2, workers=tf_workers(N0, N1))}
    assert exported(env, tf=True)[1]["TF_CONFIG"] == env["TF_CONFIG"]


def test_tf_parameter_server_has_no_rank_and_runs_untouched():
    env = azure_tf(0, workers=tf_workers(N0, N1), task="ps")
    env["TF_CONFIG"] = json.dumps(
        {**json.loads(env["TF_CONFIG"]), "cluster": {"worker": tf_workers(N0, N1), "ps": [f"{N0}:3333"]}}
    )
    with pytest.raises(tl.LaunchError, match="ps"):
        tl.resolve(env)
    # the same command line runs on every task of the job: on a ps task tb-launch changes nothing
    r = _cli(["--", sys.executable, "-c", "import os; print(os.environ.get('RANK'), os.environ['TF_CONFIG'])"], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split(" ", 1) == ["None", env["TF_CONFIG"] + "\n"]


def test_cli_tf_keeps_azures_tf_config():
    env = AZURE_TF[1]
    r = _cli(["--tf", "--", sys.executable, "-c", "import os; print(os.environ['TF_CONFIG'], os.environ['RANK'])"], env)
    assert r.returncode == 0 and r.stdout.rsplit(" ", 1) == [env["TF_CONFIG"], "1\n"]


# --- Slurm srun: --mpi=pmi2 (PMI_RANK/PMI_SIZE, no MPI_LOCALRANKID), --mpi=pmix, --mpi=none
def slurm(rank, mpi="none", **extra):
    env = {
        "SLURM_PROCID": rank,
        "SLURM_NTASKS": 4,
        "SLURM_LOCALID": rank % 2,
        "SLURM_NODEID": rank // 2,
        "SLURM_JOB_NODELIST": "gpu[1-2]",
        "SLURM_STEP_NODELIST": "gpu[1-2]",
        "SLURM_NNODES": 2,
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NUM_TASKS": 4,
        "SLURM_STEP_NUM_NODES": 2,
        "SLURM_JOB_ID": 77,
        "SLURM_STEP_ID": 0,
    }
    if mpi == "pmi2":
        env |= {"PMI_RANK": rank, "PMI_SIZE": 4, "PMI_FD": 7, "PMI_JOBID": "77.0"}
    elif mpi == "pmix":
        env |= {
            "PMIX_RANK": rank,
            "PMIX_NAMESPACE": "slurm.pmix.77.0",
            "PMIX_VERSION": "4.2.2",
            "PMIX_SERVER_URI41": "pmix-server.1234;tcp4://127.0.0.1:40000",
        }
    return s({**env, **extra})


SLURM = {mpi: [slurm(r, mpi) for r in range(4)] for mpi in ("pmi2", "pmix", "none")}


@pytest.mark.parametrize("mpi", SLURM)
@pytest.mark.parametrize("rank", range(4))
def test_slurm_srun_table(mpi, rank):
    got, out = exported(SLURM[mpi][rank], tf=True)
    assert got == want_2x2(rank, master="gpu1", port=29500)
    assert out["TRAINBASE_LAUNCHER"] == "slurm"
    assert json.loads(out["TF_CONFIG"]) == {
        "cluster": {"worker": tf_workers("gpu1", "gpu2")},
        "task": {"type": "worker", "index": rank},
    }


@pytest.mark.parametrize(
    "env, match",
    [
        (slurm(1, "pmi2", PMI_RANK="0"), "PMI_RANK=0.*SLURM_PROCID=1"),
        (slurm(1, "pmi2", PMI_SIZE="2"), "PMI_SIZE=2.*SLURM_NTASKS=4"),
        (slurm(1, "pmix", PMIX_RANK="3"), "PMIX_RANK=3.*SLURM_PROCID=1"),
        ({k: v for k, v in slurm(1, "pmi2").items() if k != "SLURM_LOCALID"}, "SLURM_LOCALID is not set"),
        ({k: v for k, v in slurm(1, "pmi2").items() if "TASKS_PER_NODE" not in k}, "SLURM_STEP_TASKS_PER_NODE"),
    ],
    ids=["pmi-rank", "pmi-size", "pmix-rank", "no-localid", "no-tasks-per-node"],
)
def test_slurm_conflicting_and_partial(env, match):
    with pytest.raises(tl.LaunchError, match=match):
        tl.resolve(env)


def test_slurm_step_tasks_per_node_missing_falls_back_to_the_jobs():
    env = {k: v for k, v in slurm(3, "pmi2").items() if k != "SLURM_STEP_TASKS_PER_NODE"}
    assert exported(env)[0] == want_2x2(3, master="gpu1", port=29500)


@pytest.mark.parametrize(
    "env, launcher",
    [
        # mpirun / mpiexec.hydra inside an sbatch script: the batch step's SLURM_PROCID=0 is in every
        # rank's environment, the MPI launcher's own variables are the truth
        (
            {**AZURE_MPI_INTEL[3], "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"},
            "pmi",
        ),
        (
            {
                **AZURE_MPI_OPENMPI[3],
                "SLURM_PROCID": "0",
                "SLURM_NTASKS": "1",
                "SLURM_LOCALID": "0",
                "SLURM_NODEID": "0",
            },
            "openmpi",
        ),
    ],
    ids=["hydra-in-sbatch", "mpirun-in-sbatch"],
)
def test_mpi_launcher_inside_a_slurm_allocation_wins_over_the_batch_step(env, launcher):
    got, out = exported(env)
    assert got == want_2x2(3) and out["TRAINBASE_LAUNCHER"] == launcher


# --- examples/tf_multiworker.py must not print OK for a lone worker of a multi-worker job
FAKE_TF = """
import json, os, types
def _n():
    c = json.loads(os.environ["TF_CONFIG"])["cluster"]
    return len(c.get("chief", [])) + len(c["worker"])
class _V:
    def __init__(self, v): self.v = v
    def numpy(self): return self.v
class _Ctx:  # a collective over the cluster TF_CONFIG describes: what TF itself would sum
    def all_reduce(self, op, v): return _V(sum(range(1, _n() + 1)))
class MultiWorkerMirroredStrategy:
    num_replicas_in_sync = property(lambda self: _n())
    def __init__(self, communication_options=None): pass
    def run(self, fn): return fn()
    def experimental_local_results(self, v): return [v]
distribute = types.SimpleNamespace(
    MultiWorkerMirroredStrategy=MultiWorkerMirroredStrategy, get_replica_context=_Ctx,
    ReduceOp=types.SimpleNamespace(SUM="sum"),
    experimental=types.SimpleNamespace(CommunicationOptions=lambda implementation=None: None,
                                       CommunicationImplementation=types.SimpleNamespace(RING="ring")))
function = lambda f: f
constant = lambda v: v
"""


def _tf_example(tmp_path, env, *args):
    (tmp_path / "tensorflow.py").write_text(FAKE_TF)
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "tf_multiworker.py"), *args],
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": f"{tmp_path}:{TOOL.parent}",
            "PYTHONDONTWRITEBYTECODE": "1",
            **env,
        },  # no __pycache__ in imagefs/
        capture_output=True,
        text=True,
        check=False,
    )


LONE = azure_tf(0, workers=["localhost:12345"])  # what the old `tb-launch --tf` wrote over Azure's


@pytest.mark.parametrize(
    "env, args",
    [
        ({**LONE, **AZURE_MPI_OPENMPI[1]}, []),  # mpirun world of 4, TF_CONFIG of 1
        ({**LONE, **AZ_BATCH}, []),  # an Azure job of 2 nodes, TF_CONFIG of 1 host
        (LONE, ["--workers", "4"]),  # the job launched 4 workers
    ],
    ids=["mpi-world", "azure-nodes", "expected-count"],
)
def test_tf_example_refuses_a_lone_worker_of_a_multi_worker_job(tmp_path, env, args):
    r = _tf_example(tmp_path, env, *args)
    assert r.returncode != 0 and "OK" not in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(
    "env, args",
    [(AZURE_TF[2], []), (AZURE_TF[2], ["--workers", "4"]), ({**AZURE_MPI_OPENMPI[2], "TRAINBASE_HOSTS": "a,b"}, [])],
    ids=["azure-tf", "azure-tf-expected", "mpi-built"],
)
def test_tf_example_passes_on_the_whole_world(tmp_path, env, args):
    r = _tf_example(tmp_path, env, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK worker=2 workers=4 allreduce=10" in r.stdout


def test_rank_and_world_size_alone_name_what_would_place_the_ranks():
    # no NODE_RANK, LOCAL_WORLD_SIZE or node count: one node (the old guess) is as likely as two
    with pytest.raises(tl.LaunchError, match="without LOCAL_WORLD_SIZE, NODE_RANK or a node count"):
        tl.resolve(s({"RANK": 1, "WORLD_SIZE": 4, "LOCAL_RANK": 1, "MASTER_ADDR": N0}))
    assert tl.resolve(s({"RANK": 0, "WORLD_SIZE": 1, "LOCAL_RANK": 0})).nnodes == 1


def test_cli_json_of_a_pass_through_world_and_export_of_a_ps_task():
    r = _cli(["--json"], azure_pytorch(3))
    assert r.returncode == 0 and json.loads(r.stdout)["world"]["local_world_size"] == 0
    ps = s(
        {
            "TF_CONFIG": json.dumps(
                {"cluster": {"worker": [f"{N0}:1"], "ps": [f"{N1}:2"]}, "task": {"type": "ps", "index": 0}}
            )
        }
    )
    r = _cli(["--export"], ps)
    assert r.returncode == 0 and r.stdout == "" and "not a worker" in r.stderr


def test_local_addresses_look_no_name_up():
    import socket

    assert REAL_LOCAL_ADDRESSES(["127.0.0.1"]) == {socket.gethostname(), "127.0.0.1"}
    assert REAL_LOCAL_ADDRESSES(["node-a.invalid", "not an address"]) == {socket.gethostname()}


def test_tf_config_refuses_ranks_not_placed_in_blocks():
    # srun -m cyclic: task 1 runs on node 1; a worker list written node by node would be wrong
    env = slurm(1, "pmix", SLURM_LOCALID="0", SLURM_NODEID="1")
    assert exported(env)[0]["NODE_RANK"] == "1"  # torch needs no block placement
    with pytest.raises(tl.LaunchError, match="not placed by node in blocks"):
        tl.resolve(env).env(tf=True)
