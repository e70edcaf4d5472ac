"""The azureml conformance tier's inputs, checked without an engine: the per-mode environment
tables it starts processes with (trainbase_conformance/azureml.py) resolve, through the image's launch
contract, to the real 2 x 2 topology; the guides' Open MPI helper (examples/azureml_env_helper.py)
works under Open MPI and stops naming the fix everywhere else, never with a KeyError."""
import json
import os
import subprocess
import sys

import pytest

from trainbase_conformance import azureml

from .conftest import ROOT
from .test_launch_contract import tl

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
