"""The azureml conformance tier's inputs, checked without an engine: the per-mode environment
tables it starts processes with (trainbase_conformance/azureml.py) resolve, through the image's launch
contract, to the real 2 x 2 topology; the guides' Open MPI helper (examples/azureml_env_helper.py)
works under Open MPI and stops naming the fix everywhere else, never with a KeyError. And the
tier's judgement of what the processes saw (azureml.topology_problems): every launch as the
image's tb-launch performs it passes, and one that leaves out a NODE_RANK or LOCAL_WORLD_SIZE
its mode sets, or sets a wrong one, fails."""
import json
import os
import subprocess
import sys

import pytest

from trainbase_conformance import azureml

from .conftest import ROOT
from .test_launch_contract import ompi, tl

HELPER = ROOT / "examples" / "azureml_env_helper.py"
IPS = ["172.30.0.2", "172.30.0.3"]


@pytest.fixture(autouse=True)
def _not_on_an_azure_node(monkeypatch):
    monkeypatch.setattr(tl, "_local_addresses", lambda hosts: set())


def test_type_pytorch_processes_resolve_to_the_2x2_world():
    procs = azureml.pytorch(IPS, 2)
    worlds = [tl.resolve(p.env) for p in procs]
    assert [(w.rank, w.world_size, w.local_rank, w.node_rank) for w in worlds] == \
        [(0, 4, 0, 0), (1, 4, 1, 0), (2, 4, 0, 1), (3, 4, 1, 1)]
    assert [p.node for p in procs] == [0, 0, 1, 1]
    # Azure gives no LOCAL_WORLD_SIZE and the tier must not add one: that is the case tb-launch failed on
    assert not any("LOCAL_WORLD_SIZE" in p.env for p in procs)
    assert {w.master_addr for w in worlds} == {IPS[0]}


def test_type_pytorch_per_node_is_one_process_a_node():
    procs = azureml.pytorch(IPS, 1)
    assert [(p.node, p.env["RANK"], p.env["WORLD_SIZE"], p.env["NODE_RANK"]) for p in procs] == \
        [(0, "0", "2", "0"), (1, "1", "2", "1")]


def test_type_tensorflow_workers_are_the_nodes_addresses():
    procs = azureml.tensorflow(IPS, 2)
    cfgs = [json.loads(p.env["TF_CONFIG"]) for p in procs]
    assert cfgs[0]["cluster"]["worker"] == ["172.30.0.2:2222", "172.30.0.2:2223", "172.30.0.3:2222", "172.30.0.3:2223"]
    assert [c["task"]["index"] for c in cfgs] == [0, 1, 2, 3] and [p.node for p in procs] == [0, 0, 1, 1]
    assert [tl.resolve(p.env).node_rank for p in procs] == [0, 0, 1, 1]


def test_type_mpi_batch_variables():
    env = azureml.batch(IPS)
    assert env["AZ_BATCH_MASTER_NODE"] == "172.30.0.2:6000" and env["AZ_BATCH_NODE_LIST"] == "172.30.0.2;172.30.0.3"
    assert "AZUREML_EXPERIMENT_ID" in env      # DeepSpeed's Azure ML branch keys on it


def _helper(env, *cmd):
    base = {"PATH": os.environ["PATH"]}
    return subprocess.run([sys.executable, str(HELPER), *cmd], env={**base, **env}, capture_output=True, text=True)


def test_guides_helper_maps_open_mpi():
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", **azureml.batch(IPS)}
    code = "import json, os; print(json.dumps({k: os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', " \
           "'MASTER_ADDR', 'MASTER_PORT')}))"
    r = _helper(env, sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": IPS[0],
                                    "MASTER_PORT": "6105"}


@pytest.mark.parametrize("env, launcher", [
    ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, "Intel MPI"),
    ({"SLURM_PROCID": "1"}, "Slurm"),
    (azureml.pytorch(IPS, 2)[1].env, "RANK=1"),
], ids=["intelmpi", "slurm", "type-pytorch"])
def test_guides_helper_elsewhere_names_the_fix(env, launcher):
    r = _helper({**env, **azureml.batch(IPS)}, "true")
    assert r.returncode == 2 and "KeyError" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert launcher in r.stderr and "tb-launch python train.py" in r.stderr and "trainbase_launch.apply()" in r.stderr


# ----------------------------------------------------------------------------- the topology judgement

HOSTS = ["a", "b"]      # container i is node i, as in the tier


def launch_envs(mode: str, wrapper: str) -> list[tuple[int, dict]]:
    """(node, the environment the rendezvous probe runs with) per process of a 2 x 2 launch:
    Azure's variables, then what the wrapper adds (the image's own tb-launch; the guides' helper
    maps Open MPI's four variables and nothing else)."""
    if mode == "mpi":
        procs = [(r // 2, {**ompi(r), **azureml.batch(IPS)}) for r in range(4)]
    else:
        table = azureml.pytorch(IPS, 2) if mode == "pytorch" else azureml.tensorflow(IPS, 2)
        procs = [(p.node, dict(p.env)) for p in table]
    if wrapper == "tb-launch":
        return [(n, {**env, **tl.resolve(env).env(tf=mode == "tensorflow")}) for n, env in procs]
    if wrapper == "guides-helper":
        return [(n, {**env, "RANK": env["OMPI_COMM_WORLD_RANK"], "WORLD_SIZE": env["OMPI_COMM_WORLD_SIZE"],
                     "LOCAL_RANK": env["OMPI_COMM_WORLD_LOCAL_RANK"]}) for n, env in procs]
    return procs


def probe_lines(procs: list[tuple[int, dict]]) -> list[dict]:
    """What probes/rendezvous.py prints for each process: its view and the table rank 0 gathered."""
    def opt(env, name):
        return int(env[name]) if name in env else None

    views = [{"host": HOSTS[n], "rank": int(e["RANK"]), "world_size": int(e["WORLD_SIZE"]),
              "local_rank": int(e["LOCAL_RANK"]), "node_rank": opt(e, "NODE_RANK"),
              "local_world_size": opt(e, "LOCAL_WORLD_SIZE")} for n, e in procs]
    table = sorted(views, key=lambda v: v["rank"])
    return [{**v, "table": table} for v in views]


@pytest.mark.parametrize("launch", sorted(azureml.LAUNCH_SETS), ids="-".join)
def test_every_launch_as_tb_launch_and_azure_perform_it_passes(launch):
    ranks = probe_lines(launch_envs(*launch))
    assert azureml.topology_problems(ranks, HOSTS, 2, azureml.LAUNCH_SETS[launch]) == []


@pytest.mark.parametrize("launch, var", [(launch, var) for launch, sets in sorted(azureml.LAUNCH_SETS.items())
                                         for var in sorted(sets)],
                         ids=lambda x: "-".join(x) if isinstance(x, tuple) else x)
def test_a_launch_without_a_variable_its_mode_sets_fails(launch, var):
    """What the check used to fill in from the topology (the node for NODE_RANK, the per-node
    count for LOCAL_WORLD_SIZE) must be there."""
    procs = [(n, {k: v for k, v in env.items() if k != var}) for n, env in launch_envs(*launch)]
    problems = azureml.topology_problems(probe_lines(procs), HOSTS, 2, azureml.LAUNCH_SETS[launch])
    assert len(problems) == 4 and all(f"no {var}, which this launch sets" in p for p in problems), problems
    assert problems[2].startswith("rank 2 runs on node 1 (b): ")


@pytest.mark.parametrize("launch", [("pytorch", "plain"), ("mpi", "tb-launch")], ids="-".join)
def test_a_zero_or_wrong_local_world_size_fails_even_where_it_may_be_absent(launch):
    for value in ("0", "4"):
        procs = [(n, {**env, "LOCAL_WORLD_SIZE": value}) for n, env in launch_envs(*launch)]
        problems = azureml.topology_problems(probe_lines(procs), HOSTS, 2, azureml.LAUNCH_SETS[launch])
        assert len(problems) == 4 and f"'local_world_size': {value}}}, want" in problems[0], problems


def test_a_wrong_node_rank_a_world_of_one_and_missing_processes_fail():
    procs = launch_envs("pytorch", "plain")
    procs[3][1]["NODE_RANK"] = "0"
    assert azureml.topology_problems(probe_lines(procs), HOSTS, 2, frozenset({"NODE_RANK"})) == [
        "rank 3 runs on node 1 (b): got {'world_size': 4, 'node_of_rank': 1, 'local_rank': 1, 'node_rank': 0}, "
        "want {'world_size': 4, 'node_of_rank': 1, 'local_rank': 1, 'node_rank': 1}"]
    # tb-launch ignoring TF_CONFIG: every worker rank 0 of 1 (the broken variant's second defect)
    alone = [(n, {**env, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
             for n, env in launch_envs("tensorflow", "tb-launch")]
    lines = [{**x, "table": [x]} for x in probe_lines(alone)]
    problems = azureml.topology_problems(lines, HOSTS, 2, azureml.LAUNCH_SETS["tensorflow", "tb-launch"])
    assert "got {'world_size': 1, " in problems[0] and problems[-1].startswith("processes gathered different tables")
    missing = azureml.topology_problems(probe_lines(procs)[:3], HOSTS, 2, frozenset())
    assert missing[0].startswith("3 of 4 processes reported")
