"""The azureml conformance tier's inputs, checked without an engine: the per-mode environment
tables it starts processes with (trainbase_conformance/azureml.py) resolve, through the image's launch
contract, to the real 2 x 2 topology; the guides' Open MPI helper (examples/azureml_env_helper.py)
works under Open MPI and stops naming the fix everywhere else, never with a KeyError. And the
tier's judgement of what the processes saw (azureml.topology_problems): every launch as the
image's tb-launch performs it passes, and one that leaves out a NODE_RANK or LOCAL_WORLD_SIZE
its mode sets, or sets a wrong one, fails. The framework modes' checks (DDP, torchrun, Lightning,
DeepSpeed, TF multi-worker, Horovod, the teardown) run unchanged on fake containers and fail
on what a given defect prints."""

import json
import os
import re
import subprocess
import sys

import pytest

from trainbase_conformance import azureml
from trainbase_conformance.checks import test_azureml as aml

from .conftest import ROOT
from .framework_fakes import HOSTS, IPS, FakeTarget, cluster, ddp, deepspeed, horovod, lightning, tf_worker
from .test_launch_contract import ompi, tl

HELPER = ROOT / "examples" / "azureml_env_helper.py"


@pytest.fixture(autouse=True)
def _not_on_an_azure_node(monkeypatch):
    monkeypatch.setattr(tl, "_local_addresses", lambda hosts: set())


def test_type_pytorch_processes_resolve_to_the_2x2_world():
    procs = azureml.pytorch(IPS, 2)
    worlds = [tl.resolve(p.env) for p in procs]
    assert [(w.rank, w.world_size, w.local_rank, w.node_rank) for w in worlds] == [
        (0, 4, 0, 0),
        (1, 4, 1, 0),
        (2, 4, 0, 1),
        (3, 4, 1, 1),
    ]
    assert [p.node for p in procs] == [0, 0, 1, 1]
    # Azure gives no LOCAL_WORLD_SIZE and the tier must not add one: that is the case tb-launch failed on
    assert not any("LOCAL_WORLD_SIZE" in p.env for p in procs)
    assert {w.master_addr for w in worlds} == {IPS[0]}


def test_type_pytorch_per_node_is_one_process_a_node():
    procs = azureml.pytorch(IPS, 1)
    assert [(p.node, p.env["RANK"], p.env["WORLD_SIZE"], p.env["NODE_RANK"]) for p in procs] == [
        (0, "0", "2", "0"),
        (1, "1", "2", "1"),
    ]


def test_type_tensorflow_workers_are_the_nodes_addresses():
    procs = azureml.tensorflow(IPS, 2)
    cfgs = [json.loads(p.env["TF_CONFIG"]) for p in procs]
    assert cfgs[0]["cluster"]["worker"] == ["172.30.0.2:2222", "172.30.0.2:2223", "172.30.0.3:2222", "172.30.0.3:2223"]
    assert [c["task"]["index"] for c in cfgs] == [0, 1, 2, 3] and [p.node for p in procs] == [0, 0, 1, 1]
    assert [tl.resolve(p.env).node_rank for p in procs] == [0, 0, 1, 1]


def test_type_mpi_batch_variables():
    env = azureml.batch(IPS)
    assert env["AZ_BATCH_MASTER_NODE"] == "172.30.0.2:6000" and env["AZ_BATCH_NODE_LIST"] == "172.30.0.2;172.30.0.3"
    assert "AZUREML_EXPERIMENT_ID" in env  # DeepSpeed's Azure ML branch keys on it


def _helper(env, *cmd):
    base = {"PATH": os.environ["PATH"]}
    return subprocess.run(
        [sys.executable, str(HELPER), *cmd], env={**base, **env}, capture_output=True, text=True, check=False
    )


def test_guides_helper_maps_open_mpi():
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        **azureml.batch(IPS),
    }
    code = (
        "import json, os; print(json.dumps({k: os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', "
        "'MASTER_ADDR', 'MASTER_PORT')}))"
    )
    r = _helper(env, sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": IPS[0],
        "MASTER_PORT": "6105",
    }


@pytest.mark.parametrize(
    "env, launcher",
    [
        ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, "Intel MPI"),
        ({"SLURM_PROCID": "1"}, "Slurm"),
        (azureml.pytorch(IPS, 2)[1].env, "RANK=1"),
    ],
    ids=["intelmpi", "slurm", "type-pytorch"],
)
def test_guides_helper_elsewhere_names_the_fix(env, launcher):
    r = _helper({**env, **azureml.batch(IPS)}, "true")
    assert r.returncode == 2 and "KeyError" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert launcher in r.stderr and "tb-launch python train.py" in r.stderr and "trainbase_launch.apply()" in r.stderr


# ----------------------------------------------------------------------------- the topology judgement


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
        return [
            (
                n,
                {
                    **env,
                    "RANK": env["OMPI_COMM_WORLD_RANK"],
                    "WORLD_SIZE": env["OMPI_COMM_WORLD_SIZE"],
                    "LOCAL_RANK": env["OMPI_COMM_WORLD_LOCAL_RANK"],
                },
            )
            for n, env in procs
        ]
    return procs


def probe_lines(procs: list[tuple[int, dict]]) -> list[dict]:
    """What probes/rendezvous.py prints for each process: its view and the table rank 0 gathered."""

    def opt(env, name):
        return int(env[name]) if name in env else None

    views = [
        {
            "host": HOSTS[n],
            "rank": int(e["RANK"]),
            "world_size": int(e["WORLD_SIZE"]),
            "local_rank": int(e["LOCAL_RANK"]),
            "node_rank": opt(e, "NODE_RANK"),
            "local_world_size": opt(e, "LOCAL_WORLD_SIZE"),
        }
        for n, e in procs
    ]
    table = sorted(views, key=lambda v: v["rank"])
    return [{**v, "table": table} for v in views]


@pytest.mark.parametrize("launch", sorted(azureml.LAUNCH_SETS), ids="-".join)
def test_every_launch_as_tb_launch_and_azure_perform_it_passes(launch):
    ranks = probe_lines(launch_envs(*launch))
    assert azureml.topology_problems(ranks, HOSTS, 2, azureml.LAUNCH_SETS[launch]) == []


@pytest.mark.parametrize(
    "launch, var",
    [(launch, var) for launch, sets in sorted(azureml.LAUNCH_SETS.items()) for var in sorted(sets)],
    ids=lambda x: "-".join(x) if isinstance(x, tuple) else x,
)
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
        "want {'world_size': 4, 'node_of_rank': 1, 'local_rank': 1, 'node_rank': 1}"
    ]
    # tb-launch ignoring TF_CONFIG: every worker rank 0 of 1 (the broken variant's second defect)
    alone = [
        (n, {**env, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
        for n, env in launch_envs("tensorflow", "tb-launch")
    ]
    lines = [{**x, "table": [x]} for x in probe_lines(alone)]
    problems = azureml.topology_problems(lines, HOSTS, 2, azureml.LAUNCH_SETS["tensorflow", "tb-launch"])
    assert "got {'world_size': 1, " in problems[0] and problems[-1].startswith("processes gathered different tables")
    missing = azureml.topology_problems(probe_lines(procs)[:3], HOSTS, 2, frozenset())
    assert missing[0].startswith("3 of 4 processes reported")


# ----------------------------------------------------------------------------- the framework modes
# The tier's framework checks run unchanged on two fake containers (tests/unit/framework_fakes.py):
# the suite's own Job starts every process as Azure ML does; each fake process answers with the
# example's line for the world its environment gives it (healthy), or what a given defect prints.


def azure_job(answer, frameworks, packages=None):
    target = FakeTarget(frameworks, packages=packages)
    return target, aml.Job(cluster(answer), target)


def from_env(line):
    """A process that prints ``line(rank, world, node)`` for the world its environment names."""
    return lambda node, cmd, env: (0, line(int(env["RANK"]), int(env["WORLD_SIZE"]), node))


def mpi_world(text_of_rank, n=4):
    """A `type: mpi` launch (one mpirun on node 0) whose ranks print ``text_of_rank(rank)``."""
    return lambda node, cmd, env: (0, "".join(text_of_rank(r) for r in range(n)))


def ddp_of(rank, world, node):
    return ddp(rank, world=world, node_rank=node)


def test_type_mpi_ddp_fails_when_each_node_is_a_world_of_two():
    """tb-launch taking Open MPI's local size for the world: ranks 0-1 twice, a world of 2 each."""
    target, job = azure_job(mpi_world(lambda r: ddp(r)), {"pytorch": "2.10.0"})
    aml.test_type_mpi_pytorch_ddp(target, job, "tb-launch")
    target, job = azure_job(mpi_world(lambda r: ddp(r % 2, world=2)), {"pytorch": "2.10.0"})
    with pytest.raises(
        AssertionError,
        match=re.escape("type: mpi, tb-launch, pytorch_ddp.py: ranks that finished: ['0', '0', '1', '1'], want 0..3"),
    ):
        aml.test_type_mpi_pytorch_ddp(target, job, "tb-launch")


def test_type_pytorch_ddp_fails_when_a_process_exits_non_zero():
    target, job = azure_job(from_env(ddp_of), {"pytorch": "2.10.0"})
    aml.test_type_pytorch_ddp(target, job, "plain")

    def rank_3_times_out(node, cmd, env):
        if env["RANK"] == "3":
            return (
                1,
                "",
                "torch.distributed.DistStoreError: Timed out after 300 seconds waiting for clients. 3/4 clients joined.",
            )
        return 0, ddp_of(int(env["RANK"]), 4, node)

    target, job = azure_job(rank_3_times_out, {"pytorch": "2.10.0"})
    with pytest.raises(
        AssertionError,
        match=r"type: pytorch, plain, pytorch_ddp\.py: node 1 rank 3: exit 1: "
        r"torch\.distributed\.DistStoreError: Timed out",
    ):
        aml.test_type_pytorch_ddp(target, job, "plain")


def test_type_pytorch_per_node_torchrun_fails_when_torchrun_loses_the_node_variables():
    """tb-launch dropping Azure's NODE_RANK / MASTER_* before torchrun: each node a standalone world of 2."""
    whole = lambda node, cmd, env: (0, ddp(2 * node) + ddp(2 * node + 1))  # noqa: E731
    target, job = azure_job(whole, {"pytorch": "2.10.0"})
    aml.test_type_pytorch_per_node_torchrun(target, job, "tb-launch")
    alone = lambda node, cmd, env: (0, ddp(0, world=2, host="ab"[node]) + ddp(1, world=2, host="ab"[node]))  # noqa: E731
    target, job = azure_job(alone, {"pytorch": "2.10.0"})
    with pytest.raises(
        AssertionError,
        match=re.escape(
            "type: pytorch per node, tb-launch torchrun, pytorch_ddp.py: ranks that finished: ['0', '0', '1', '1']"
        ),
    ):
        aml.test_type_pytorch_per_node_torchrun(target, job, "tb-launch")


LIGHTNING = {"pytorch": {"lightning": "2.6.0"}}


def test_type_pytorch_lightning_fails_when_lightning_ignores_the_node_rank():
    """Lightning that trains a world of 2 on each node (no num_nodes from Azure's variables)."""
    target, job = azure_job(
        from_env(lambda r, w, n: lightning(r, w, "LightningEnvironment")), {"pytorch": "2.10.0"}, LIGHTNING
    )
    aml.test_type_pytorch_lightning(target, job, "plain")
    target, job = azure_job(
        from_env(lambda r, w, n: lightning(r % 2, 2, "LightningEnvironment")), {"pytorch": "2.10.0"}, LIGHTNING
    )
    with pytest.raises(
        AssertionError,
        match=re.escape("type: pytorch, plain, lightning_ddp.py: ranks that finished: ['0', '0', '1', '1']"),
    ):
        aml.test_type_pytorch_lightning(target, job, "plain")


def test_type_mpi_lightning_fails_when_every_rank_trains_alone():
    """The contract's Lightning patch removed: under `type: mpi` each rank a world of 1."""
    target, job = azure_job(
        mpi_world(lambda r: lightning(r, 4, "TorchElasticEnvironment")), {"pytorch": "2.10.0"}, LIGHTNING
    )
    aml.test_type_mpi_lightning(target, job, "tb-launch lightning_ddp.py")
    target, job = azure_job(
        mpi_world(lambda r: lightning(0, 1, "LightningEnvironment")), {"pytorch": "2.10.0"}, LIGHTNING
    )
    with pytest.raises(
        AssertionError,
        match=re.escape("type: mpi, tb-launch lightning_ddp.py: ranks that finished: ['0', '0', '0', '0'], want 0..3"),
    ):
        aml.test_type_mpi_lightning(target, job, "tb-launch lightning_ddp.py")


def test_deepspeed_init_fails_without_its_azure_ml_branch():
    """DeepSpeed that does not read Open MPI's variables under AZUREML_EXPERIMENT_ID: a world of 1 per rank."""
    target, job = azure_job(mpi_world(lambda r: deepspeed(r, 4, r % 2)), {"deepspeed": "0.18.2"})
    aml.test_deepspeed_init(target, job, "type: mpi", "plain")
    target, job = azure_job(mpi_world(lambda r: deepspeed(0, 1)), {"deepspeed": "0.18.2"})
    with pytest.raises(
        AssertionError,
        match=re.escape("type: mpi, plain, deepspeed_init.py: ranks that finished: ['0', '0', '0', '0'], want 0..3"),
    ):
        aml.test_deepspeed_init(target, job, "type: mpi", "plain")


def test_type_tensorflow_fails_when_tb_launch_rewrites_tf_config():
    """tb-launch --tf writing a one-worker TF_CONFIG over Azure's: every worker 0 of 1."""

    def azure_s(node, cmd, env):
        task = json.loads(env["TF_CONFIG"])["task"]["index"]
        return 0, tf_worker(task, 4)

    target, job = azure_job(azure_s, {"tensorflow": "2.20.0"})
    aml.test_type_tensorflow_multiworker(target, job, "tb-launch")
    target, job = azure_job(lambda node, cmd, env: (0, tf_worker(0, 1)), {"tensorflow": "2.20.0"})
    with pytest.raises(
        AssertionError,
        match=re.escape(
            "type: tensorflow, tb-launch, tf_multiworker.py: workers that finished: ['0', '0', '0', '0'], want 0..3"
        ),
    ):
        aml.test_type_tensorflow_multiworker(target, job, "tb-launch")


def test_type_mpi_tensorflow_fails_when_the_workers_never_meet():
    """tb-launch --tf ignoring AZ_BATCH_HOST_LIST: the workers wait for addresses nobody serves
    until `timeout` ends the job (exit 124)."""
    target, job = azure_job(mpi_world(lambda r: tf_worker(r, 4)), {"tensorflow": "2.20.0"})
    aml.test_type_mpi_tensorflow_multiworker(target, job)
    target, job = azure_job(
        lambda node, cmd, env: (124, "", "grpc: failed to connect to all addresses"), {"tensorflow": "2.20.0"}
    )
    with pytest.raises(
        AssertionError,
        match=r"type: mpi, tb-launch --tf, tf_multiworker\.py: node 0 rank \*: exit 124: "
        r"grpc: failed to connect",
    ):
        aml.test_type_mpi_tensorflow_multiworker(target, job)


def test_teardown_check_fails_on_one_aborted_process_in_many_jobs(monkeypatch):
    """gloo's abort at interpreter exit (exit 134), in 1 process of 1 job: rare, and a failure."""
    monkeypatch.setattr(aml, "TEARDOWN_RUNS", 20)
    target, job = azure_job(from_env(ddp_of), {"pytorch": "2.10.0"})
    aml.test_pytorch_teardown_never_aborts_a_finished_job(target, job)
    rank_2_runs = []

    def one_abort(node, cmd, env):
        if env["RANK"] == "2":
            rank_2_runs.append(cmd)
            if len(rank_2_runs) == 8:  # rank 2 of the 8th job (run 7)
                return 134, "", "terminate called without an active exception"
        return 0, ddp_of(int(env["RANK"]), 4, 0)

    target, job = azure_job(one_abort, {"pytorch": "2.10.0"})
    with pytest.raises(
        AssertionError,
        match=r"1 of 80 processes in 20 finished jobs did not exit 0 \(exit codes "
        r"\{0: 79, 134: 1\}\): run 7 rank 2: exit 134: terminate called",
    ):
        aml.test_pytorch_teardown_never_aborts_a_finished_job(target, job)


def test_type_mpi_horovod_fails_when_every_rank_is_a_world_of_one():
    target, job = azure_job(mpi_world(lambda r: horovod(r, 4, r % 2)), {"horovod": "0.28.1"})
    aml.test_type_mpi_horovod(target, job)
    target, job = azure_job(mpi_world(lambda r: horovod(0, 1)), {"horovod": "0.28.1"})
    with pytest.raises(
        AssertionError,
        match=re.escape("type: mpi, plain, horovod_allreduce.py: ranks that finished: ['0', '0', '0', '0'], want 0..3"),
    ):
        aml.test_type_mpi_horovod(target, job)


def tf_rendezvous(alone: bool = False):
    """`type: tensorflow` processes answering as probes/rendezvous.py does under `tb-launch --tf`:
    each finds its line by its own TF_CONFIG (the world tb-launch resolves from it), or, with
    ``alone``, a tb-launch that ignored TF_CONFIG (every worker rank 0 of a world of 1)."""
    procs = launch_envs("tensorflow", "tb-launch")
    if alone:
        procs = [(n, {**env, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}) for n, env in procs]
    lines = probe_lines(procs)
    if alone:
        lines = [{**x, "table": [x]} for x in lines]
    by_config = {env["TF_CONFIG"]: line for (_, env), line in zip(procs, lines, strict=True)}

    def answer(node, cmd, env):
        assert cmd.split()[2:4] == ["tb-launch", "--tf"], cmd
        return 0, "TBCONF " + json.dumps(by_config[env["TF_CONFIG"]]) + "\n"

    return answer


def test_type_tensorflow_rendezvous_fails_when_tb_launch_ignores_tf_config():
    """The check itself on Azure's 4 TF_CONFIG processes: the world tb-launch --tf resolves from
    each passes; a tb-launch that ignores TF_CONFIG (the variant tb-launch-azure-modes-regressed's
    second defect) leaves every worker a world of 1, and the check names rank 0's."""
    target, job = azure_job(tf_rendezvous(), {"tensorflow": "2.20.0"})
    aml.test_type_tensorflow_rendezvous(target, job)
    target, job = azure_job(tf_rendezvous(alone=True), {"tensorflow": "2.20.0"})
    with pytest.raises(
        AssertionError,
        match=re.escape(
            "type: tensorflow, tb-launch --tf, rendezvous probe: rank 0 runs on node 0 (a): got {'world_size': 1, "
        ),
    ):
        aml.test_type_tensorflow_rendezvous(target, job)
