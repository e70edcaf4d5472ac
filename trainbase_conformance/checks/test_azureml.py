"""Azure ML: every distribution mode, on 2 containers x 2 processes, each process started with
the exact environment Azure ML gives it (trainbase_conformance/azureml.py), with and without tb-launch:

* ``type: mpi`` -- the image's mpirun started on node 0 with Azure's Batch variables forwarded;
* ``type: pytorch`` -- the 4 processes started by the suite itself (as Azure does), 2 per node;
* ``type: pytorch`` per node -- one process a node, torchrun inside it;
* ``type: tensorflow`` -- 4 workers, each with its own TF_CONFIG.

On every image the stdlib rendezvous probe checks each launch variable against the real 2 x 2
topology (which container each process ran in); where the image has them, DDP, Lightning,
DeepSpeed and TF multi-worker then run and check a collective. A client that cannot work in a
mode (the guides' Open MPI helper on Intel MPI) must stop naming the fix, never with a
KeyError. Every process of every run must exit 0: a job whose training succeeded but whose
teardown aborted is a failed job on Azure ML (the repeated teardown check is the last test)."""

from __future__ import annotations

import concurrent.futures
import os

import pytest

from trainbase_conformance import azureml
from trainbase_conformance.checks.test_frameworks import EX, need, ok_lines, put_examples
from trainbase_conformance.fixtures import PROBE_DIR, tbconf_lines

PER_NODE = 2
WORLD = 2 * PER_NODE
# How often the teardown check runs a 4-process job: the abort it guards against hit 3 of 72
# jobs (4 %); with 100 runs a 4 % failure rate passes unseen with probability 0.96^100 = 1.7 %.
TEARDOWN_RUNS = int(os.environ.get("TRAINBASE_TEARDOWN_RUNS", "100"))

pytestmark = [pytest.mark.azureml, pytest.mark.evidence("run")]


class Job:
    """One cluster (containers ``a``, ``b``) seen as an AmlCompute job: node IPs, and ways to
    start processes the way each distribution mode does."""

    def __init__(self, cluster, target):
        self.cluster, self.target = cluster, target
        self.ips = []
        for node in cluster.nodes:
            r = node.exec("hostname -i")
            assert r.returncode == 0, f"hostname -i in {node.hostname}: {r.stderr}"
            self.ips.append(r.stdout.split()[0])
        put_examples(*cluster.nodes)

    @property
    def python(self) -> str:
        return self.cluster.python

    def mpi(self, cmd: str, per_node: int = PER_NODE, timeout: int = 300):
        """`type: mpi`: Azure ML's mpirun on node 0, its Batch variables forwarded to every rank."""
        env = azureml.batch(self.ips)
        mpi = self.cluster.mpi
        line = f"timeout {timeout} {mpi.across(self.cluster.hosts, per_node)} {mpi.forward(sorted(env))} {cmd}"
        r = self.cluster.nodes[0].exec(line, timeout=timeout + 30, env=env)
        return [(None, r)]

    def processes(self, procs: list[azureml.Process], cmd: str, timeout: int = 300):
        """Start every process at once, each in its node with exactly its environment (``cmd``
        may read it: ``$NODE_RANK`` and the like are expanded by the process's own shell)."""

        def one(p: azureml.Process):
            return p, self.cluster.nodes[p.node].exec(f"timeout {timeout} {cmd}", timeout=timeout + 30, env=p.env)

        with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:
            return list(pool.map(one, procs))


@pytest.fixture(scope="module")
def job(cluster, target):
    return Job(cluster, target)


def outputs(results, what: str) -> str:
    """Every process's stdout, after checking each exited 0."""
    bad = [
        f"node {p.node if p else 0} rank {(p.env.get('RANK') if p else '*')}: exit {r.returncode}: "
        f"{(r.stderr or r.stdout).strip()[-1200:]}"
        for p, r in results
        if r.returncode != 0
    ]
    assert not bad, f"{what}: " + "\n".join(bad)
    return "".join(r.stdout for _, r in results)


def check_topology(job: Job, stdout: str, what: str, sets: frozenset[str], per_node: int = PER_NODE) -> None:
    """The rendezvous probe's lines against the real topology (azureml.topology_problems): every
    value right, and NODE_RANK / LOCAL_WORLD_SIZE present wherever the launch sets them
    (``sets``, from azureml.LAUNCH_SETS) -- never filled in from the topology they are checked
    against, which let a launch that left them out pass."""
    ranks = tbconf_lines(stdout)
    problems = azureml.topology_problems(ranks, job.cluster.hosts, per_node, sets)
    shown = "\n".join(problems[:8]) + (f"\n... {len(problems) - 8} more" if len(problems) > 8 else "")
    assert not problems, f"{what}: {shown}" + ("" if ranks else f"\n{stdout.strip()[-1500:]}")


def check_ok(job: Job, stdout: str, what: str, n: int = WORLD, key: str = "rank") -> list[dict]:
    lines = ok_lines(stdout)
    assert sorted(int(x[key]) for x in lines) == list(range(n)), (
        f"{what}: {key}s that finished: {sorted(x[key] for x in lines)}, want 0..{n - 1}: {stdout.strip()[-1500:]}"
    )
    for x in lines:
        assert (x.get("world") or x.get("workers") or x.get("size")) == str(n), f"{what}: world size: {x}"
        if "host" in x and "node_rank" in x and x["node_rank"] != "None":
            assert int(x["node_rank"]) == job.cluster.hosts.index(x["host"]), f"{what}: NODE_RANK vs host: {x}"
    return lines


def helper_refuses_with_the_fix(job: Job, results, what: str) -> None:
    """The guides' helper on a non-Open MPI launch: every rank stops, naming tb-launch."""
    text = "".join((r.stdout or "") + (r.stderr or "") for _, r in results)
    assert all(r.returncode != 0 for _, r in results), f"{what}: exited 0 without Open MPI's variables"
    assert "KeyError" not in text and "Traceback" not in text, f"{what}: {text[-1500:]}"
    assert "tb-launch" in text and "trainbase_launch.apply()" in text, f"{what}: no fix named: {text[-1500:]}"


WRAP = {"plain": "", "tb-launch": "tb-launch ", "guides-helper": f"{{python}} {EX}/azureml_env_helper.py "}


def wrapped(job: Job, wrapper: str, cmd: str) -> str:
    return WRAP[wrapper].format(python=job.python) + cmd


def type_mpi(job: Job, wrapper: str, cmd: str, what: str, check) -> None:
    """`type: mpi` with ``wrapper`` around ``cmd``; the guides' helper on another MPI than Open
    MPI must refuse with the fix, everything else must pass ``check``."""
    results = job.mpi(wrapped(job, wrapper, cmd))
    if wrapper == "guides-helper" and job.cluster.mpi.kind != "openmpi":
        return helper_refuses_with_the_fix(job, results, what)
    check(job, outputs(results, what), what)


# ----------------------------------------------------------------------------- every image


@pytest.mark.parametrize("wrapper", ["tb-launch", "guides-helper"])
@pytest.mark.trainbase_contract("tb-launch")
def test_type_mpi_rendezvous(target, job, wrapper):
    """`type: mpi`: every launch variable from the MPI launcher + Azure's Batch variables."""
    type_mpi(
        job,
        wrapper,
        f"{job.python} {PROBE_DIR}/rendezvous.py",
        f"type: mpi, {wrapper}, rendezvous probe",
        lambda job, out, what: check_topology(job, out, what, sets=azureml.LAUNCH_SETS["mpi", wrapper]),
    )


@pytest.mark.parametrize("wrapper", ["plain", "tb-launch"])
@pytest.mark.trainbase_contract("tb-launch")
def test_type_pytorch_rendezvous(target, job, wrapper):
    """`type: pytorch`: Azure's per-process variables, taken as they are or through tb-launch
    (which must neither refuse them nor invent a LOCAL_WORLD_SIZE from a world it cannot see)."""
    what = f"type: pytorch, {wrapper}, rendezvous probe"
    results = job.processes(
        azureml.pytorch(job.ips, PER_NODE), wrapped(job, wrapper, f"{job.python} {PROBE_DIR}/rendezvous.py")
    )
    check_topology(job, outputs(results, what), what, azureml.LAUNCH_SETS["pytorch", wrapper])


@pytest.mark.trainbase_contract("tb-launch")
def test_type_tensorflow_rendezvous(target, job):
    """`type: tensorflow`: tb-launch --tf reads the world from Azure's TF_CONFIG (never
    replacing it) and gives the same world to a script reading RANK/WORLD_SIZE."""
    what = "type: tensorflow, tb-launch --tf, rendezvous probe"
    results = job.processes(
        azureml.tensorflow(job.ips, PER_NODE), f"tb-launch --tf {job.python} {PROBE_DIR}/rendezvous.py"
    )
    check_topology(job, outputs(results, what), what, azureml.LAUNCH_SETS["tensorflow", "tb-launch"])


# ----------------------------------------------------------------------------- PyTorch

DDP = f"{EX}/pytorch_ddp.py --backend gloo"


@pytest.mark.parametrize("wrapper", ["plain", "tb-launch", "guides-helper"])
@pytest.mark.trainbase_contract("tb-launch")
def test_type_mpi_pytorch_ddp(target, job, wrapper):
    need(target, "pytorch")
    type_mpi(job, wrapper, f"{job.python} {DDP}", f"type: mpi, {wrapper}, pytorch_ddp.py", check_ok)


@pytest.mark.parametrize("wrapper", ["plain", "tb-launch"])
def test_type_pytorch_ddp(target, job, wrapper):
    need(target, "pytorch")
    what = f"type: pytorch, {wrapper}, pytorch_ddp.py"
    results = job.processes(azureml.pytorch(job.ips, PER_NODE), wrapped(job, wrapper, f"{job.python} {DDP}"))
    check_ok(job, outputs(results, what), what)


@pytest.mark.parametrize("wrapper", ["plain", "tb-launch"])
@pytest.mark.trainbase_contract("tb-launch")
def test_type_pytorch_per_node_torchrun(target, job, wrapper):
    """process_count_per_instance = 1, the command is torchrun: plain, it is given Azure's
    per-node variables on its command line; through tb-launch, tb-launch hands them on."""
    need(target, "pytorch")
    what = f"type: pytorch per node, {wrapper} torchrun, pytorch_ddp.py"
    torchrun = f"{target.components['python']['prefix']}/bin/torchrun --nproc-per-node {PER_NODE}"
    if wrapper == "plain":
        cmd = (
            f"sh -c '{torchrun} --nnodes 2 --node-rank $NODE_RANK --master-addr $MASTER_ADDR "
            f"--master-port $MASTER_PORT {DDP}'"
        )
    else:
        cmd = f"tb-launch {torchrun} {DDP}"
    check_ok(job, outputs(job.processes(azureml.pytorch(job.ips, 1), cmd), what), what)


@pytest.mark.parametrize("wrapper", ["plain", "tb-launch"])
@pytest.mark.trainbase_contract("the manifest's framework_packages")
def test_type_pytorch_lightning(target, job, wrapper):
    """Lightning under `type: pytorch`: the Trainer is told devices and num_nodes (Azure gives
    no node count); rank, node rank and world come from Azure's variables."""
    need(target, "pytorch")
    if "lightning" not in (target.manifest.get("framework_packages") or {}).get("pytorch", {}):
        pytest.skip(f"{target.name} has no Lightning")
    what = f"type: pytorch, {wrapper}, lightning_ddp.py"
    results = job.processes(
        azureml.pytorch(job.ips, PER_NODE),
        wrapped(job, wrapper, f"{job.python} {EX}/lightning_ddp.py --devices 2 --num-nodes 2"),
        timeout=400,
    )
    check_ok(job, outputs(results, what), what)


@pytest.mark.parametrize("client", ["lightning_azureml.py per-process", "tb-launch lightning_ddp.py"])
@pytest.mark.trainbase_contract("tb-launch")
def test_type_mpi_lightning(target, job, client):
    need(target, "pytorch")
    if "lightning" not in (target.manifest.get("framework_packages") or {}).get("pytorch", {}):
        pytest.skip(f"{target.name} has no Lightning")
    what = f"type: mpi, {client}"
    if client.startswith("tb-launch"):
        cmd = f"tb-launch {job.python} {EX}/lightning_ddp.py"
    else:
        cmd = f"{job.python} {EX}/lightning_azureml.py per-process --devices 2 --num-nodes 2"
    check_ok(job, outputs(job.mpi(cmd, timeout=400), what), what)


@pytest.mark.parametrize("mode", ["type: mpi", "type: pytorch"])
@pytest.mark.parametrize("wrapper", ["plain", "tb-launch"])
def test_deepspeed_init(target, job, mode, wrapper):
    """DeepSpeed's init_distributed: plain under `type: mpi` it takes its own Azure ML branch
    (AZUREML_EXPERIMENT_ID set), which reads Open MPI's variables; under `type: pytorch` it reads
    RANK/WORLD_SIZE as Azure set them."""
    need(target, "deepspeed")
    what = f"{mode}, {wrapper}, deepspeed_init.py"
    cmd = wrapped(job, wrapper, f"{job.python} {EX}/deepspeed_init.py")
    results = job.mpi(cmd) if mode == "type: mpi" else job.processes(azureml.pytorch(job.ips, PER_NODE), cmd)
    check_ok(job, outputs(results, what), what)


# ----------------------------------------------------------------------------- TensorFlow


@pytest.mark.parametrize("wrapper", ["plain", "tb-launch"])
@pytest.mark.trainbase_contract("tb-launch")
def test_type_tensorflow_multiworker(target, job, wrapper):
    """Azure's TF_CONFIG is the truth: 4 workers, the all-reduce over all 4, with or without
    `tb-launch --tf` (which must keep Azure's TF_CONFIG byte for byte)."""
    need(target, "tensorflow")
    what = f"type: tensorflow, {wrapper}, tf_multiworker.py"
    cmd = (
        "tb-launch --tf " if wrapper == "tb-launch" else ""
    ) + f"{job.python} {EX}/tf_multiworker.py --workers {WORLD}"
    results = job.processes(azureml.tensorflow(job.ips, PER_NODE), f"env TF_CPP_MIN_LOG_LEVEL=2 {cmd}", timeout=400)
    check_ok(job, outputs(results, what), what, key="worker")


@pytest.mark.trainbase_contract("tb-launch")
def test_type_mpi_tensorflow_multiworker(target, job):
    """`type: mpi` + tb-launch --tf: the TF workers' addresses come from AZ_BATCH_HOST_LIST."""
    need(target, "tensorflow")
    what = "type: mpi, tb-launch --tf, tf_multiworker.py"
    results = job.mpi(f"env TF_CPP_MIN_LOG_LEVEL=2 tb-launch --tf {job.python} {EX}/tf_multiworker.py", timeout=400)
    check_ok(job, outputs(results, what), what, key="worker")


# ----------------------------------------------------------------------------- teardown


def test_pytorch_teardown_never_aborts_a_finished_job(target, job):
    """`type: pytorch` jobs that finish must all exit 0, TEARDOWN_RUNS times over: PyTorch's gloo
    worker threads could drop their last tensor references while the interpreter finalizes and
    abort the process ("terminate called without an active exception", exit 134) after the
    work had succeeded (pytorch/pytorch#190489). The image's exit hook (trainbase_exit) closes
    that window. Each run: 4 processes in one container (the case where the four share two
    cores and exit at once), the DDP example, every exit code counted."""
    need(target, "pytorch")
    procs = [azureml.Process(0, {**p.env, "MASTER_ADDR": "127.0.0.1"}) for p in azureml.pytorch(job.ips, PER_NODE)]
    codes: dict[int, int] = {}
    aborted: list[str] = []
    for run in range(TEARDOWN_RUNS):
        for p, r in job.processes(procs, f"{job.python} {DDP} --steps 2", timeout=180):
            codes[r.returncode] = codes.get(r.returncode, 0) + 1
            if r.returncode != 0 and len(aborted) < 3:
                aborted.append(
                    f"run {run} rank {p.env['RANK']}: exit {r.returncode}: {' '.join((r.stderr or '').split())[-400:]}"
                )
        if (run + 1) % 10 == 0:  # long: say how far it got (pytest -s shows it)
            print(f"teardown: {run + 1}/{TEARDOWN_RUNS} jobs, exit codes {codes}", flush=True)
    bad = sum(v for k, v in codes.items() if k != 0)
    assert not bad, (
        f"{bad} of {TEARDOWN_RUNS * len(procs)} processes in {TEARDOWN_RUNS} finished jobs did not "
        f"exit 0 (exit codes {codes}): " + " | ".join(aborted)
    )


def test_type_mpi_horovod(target, job):
    """Horovod is MPI-native: `type: mpi` with nothing but Azure's mpirun."""
    need(target, "horovod")
    what = "type: mpi, plain, horovod_allreduce.py"
    check_ok(job, outputs(job.mpi(f"{job.python} {EX}/horovod_allreduce.py"), what), what)
