"""Checks that delegate their verdict to tb-doctor or to a helper, run as they are: the gpu tier's
and the fabric tier's doctor runs, the NCCL shadow check, and `type: mpi`'s rendezvous check. Before
this file their failure table entries named tests of the doctor or of azureml.topology_problems
alone, which still passed with the check made a no-op (tests/conformance/mutation.py found them).

The doctor here is the real one (imagefs/opt/trainbase/lib/trainbase_doctor) over a fake node
(tests/unit/doctor_fakes.py): `tb-doctor --json ARGS` is answered with the report its CLI prints,
validated against docs/doctor.schema.json as the suite's Target.doctor validates it; the
rendezvous probe's ``TBCONF`` lines are those of probes/rendezvous.py for a given environment."""

import importlib
import json
import re
import shlex

import jsonschema
import pytest

from trainbase_conformance.checks import test_azureml as aml
from trainbase_conformance.checks import test_doctor, test_mpi, test_nccl
from trainbase_conformance.fixtures import DOCTOR_SCHEMA, Target

from .doctor_fakes import FakeCuda, FakeNccl, FakeNode, core, fake_mpi_launchers
from .framework_fakes import cluster
from .test_azureml_tier import azure_job, launch_envs, probe_lines
from .test_launch_contract import tl

cli = importlib.import_module("trainbase_doctor.cli")
NCCL_PATH = "/opt/trainbase/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"


class DoctorTarget:
    """A target whose image answers `tb-doctor --json ARGS` as the doctor does on ``make_node(expect)``."""

    def __init__(self, make_node):
        self.make_node = make_node

    def doctor(self, args: str = "", **kw):
        a = cli.parser().parse_args(["--json", *shlex.split(args)])
        node = self.make_node(tuple(e for e in a.expect.split(",") if e))
        results = core.run_checks(node, core.select([o for o in (a.only or "").split(",") if o]))
        report = json.loads(json.dumps(cli.node_report(node, results, 0.2)))
        jsonschema.validate(report, DOCTOR_SCHEMA)
        return report["exit_code"], report

    doctor_check = Target.doctor_check


# --------------------------------------------------------------------------- the gpu tier's doctor run


def gpu_node(root, expect, gpus=8):
    """A node with ``gpus`` H100s handed in (driver 580, CUDA 13.0), NCCL 2.27.5 loadable."""
    libs = (
        {
            "libcuda.so.1": (FakeCuda(gpus=gpus, driver_cuda=13000), "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            "libnccl.so.2": (FakeNccl(22705), NCCL_PATH),
        }
        if gpus
        else {}
    )
    return FakeNode(root, expect=expect, libs=libs, driver="580.65.06" if gpus else None)


def test_the_gpu_runner_check_fails_where_the_container_sees_no_gpu(tmp_path):
    target = DoctorTarget(lambda expect: gpu_node(tmp_path, expect, gpus=0))
    with pytest.raises(
        AssertionError,
        match=r"\['gpu\.visible: no GPU: .*libcuda\.so\.1.*"
        r"\(and --expect gpu says it must be\)'",
    ):
        test_doctor.test_doctor_on_a_gpu_runner(target)


def test_the_gpu_runner_check_names_every_failing_doctor_check(tmp_path):
    target = DoctorTarget(lambda expect: gpu_node(tmp_path, expect, gpus=0))
    with pytest.raises(AssertionError) as e:
        test_doctor.test_doctor_on_a_gpu_runner(target)
    named = re.findall(r"'([a-z]+\.[a-z.]+): ", str(e.value))
    assert {"gpu.visible", "nccl.network"} <= set(named), named


# --------------------------------------------------------------------------- the fabric tier's doctor run


def rdma_node(root, expect, state="4: ACTIVE"):
    node = FakeNode(root, expect=expect, memlock=-1)
    node.rdma_device("mlx5_0", uverbs=0, state=state)
    return node


def test_the_rdma_runner_check_fails_on_a_port_that_is_down(tmp_path):
    target = DoctorTarget(lambda expect: rdma_node(tmp_path, expect, state="1: DOWN"))
    with pytest.raises(
        AssertionError, match=re.escape("'ib.ports: no ACTIVE port: mlx5_0/1 DOWN (InfiniBand, 400 Gb/sec (4X NDR))'")
    ):
        test_doctor.test_doctor_on_an_rdma_runner(target)


def test_the_rdma_runner_check_fails_where_no_rdma_device_is_handed_in(tmp_path):
    target = DoctorTarget(lambda expect: FakeNode(tmp_path, expect=expect))
    with pytest.raises(AssertionError, match=r"'ib\.devices: "):
        test_doctor.test_doctor_on_an_rdma_runner(target)


# --------------------------------------------------------------------------- NCCL's shadow


def shadow_node(root, shadowed: bool):
    image_lib = root / NCCL_PATH.lstrip("/")
    image_lib.parent.mkdir(parents=True, exist_ok=True)
    image_lib.write_bytes(b"nccl")
    env = {"PATH": "/usr/bin:/bin"}
    if shadowed:
        shadow = root / "opt" / "shadow" / "libnccl.so.2"
        shadow.parent.mkdir(parents=True, exist_ok=True)
        shadow.write_bytes(b"nccl")
        env["LD_LIBRARY_PATH"] = "/opt/shadow"
    ldconfig = (0, f"\tlibnccl.so.2 (libc6,x86-64) => {NCCL_PATH}\n")
    return lambda expect: FakeNode(root, env=env, expect=expect, commands={"ldconfig -p": ldconfig})


def test_the_shadow_check_fails_on_a_second_nccl_earlier_on_the_library_path(tmp_path):
    with pytest.raises(
        AssertionError,
        match=r"2 different NCCL libraries a process could load: "
        r".*/opt/shadow/libnccl\.so\.2 \(LD_LIBRARY_PATH",
    ):
        test_nccl.test_no_second_nccl_on_the_library_path(DoctorTarget(shadow_node(tmp_path, True)))
    test_nccl.test_no_second_nccl_on_the_library_path(DoctorTarget(shadow_node(tmp_path / "clean", False)))


# --------------------------------------------------------------------------- type: mpi, the rendezvous probe


@pytest.fixture(autouse=True)
def _not_on_an_azure_node(monkeypatch):
    monkeypatch.setattr(tl, "_local_addresses", lambda hosts: set())


def rendezvous(procs, rc=0, stderr=""):
    """One mpirun on node 0 whose 4 ranks print probes/rendezvous.py's TBCONF lines for ``procs``."""
    text = "".join(f"TBCONF {json.dumps(line)}\n" for line in probe_lines(procs))
    return lambda node, cmd, env: (rc, text, stderr)


@pytest.mark.parametrize("wrapper", ["tb-launch", "guides-helper"])
def test_type_mpi_rendezvous_passes_as_azure_and_the_wrapper_launch_it(wrapper):
    target, job = azure_job(rendezvous(launch_envs("mpi", wrapper)), {})
    aml.test_type_mpi_rendezvous(target, job, wrapper)


def test_type_mpi_rendezvous_fails_when_tb_launch_sets_no_node_rank():
    procs = [(n, {k: v for k, v in env.items() if k != "NODE_RANK"}) for n, env in launch_envs("mpi", "tb-launch")]
    target, job = azure_job(rendezvous(procs), {})
    with pytest.raises(
        AssertionError,
        match=re.escape(
            "type: mpi, tb-launch, rendezvous probe: rank 0 runs on node 0 (a): no NODE_RANK, which this launch sets"
        ),
    ):
        aml.test_type_mpi_rendezvous(target, job, "tb-launch")


def test_type_mpi_rendezvous_fails_on_a_wrong_rank_under_the_guides_helper():
    procs = launch_envs("mpi", "guides-helper")
    procs[3][1]["RANK"] = "2"
    target, job = azure_job(rendezvous(procs), {})
    with pytest.raises(AssertionError, match=r"type: mpi, guides-helper, rendezvous probe: "):
        aml.test_type_mpi_rendezvous(target, job, "guides-helper")


def test_type_mpi_rendezvous_fails_when_the_launch_exits_non_zero():
    target, job = azure_job(
        rendezvous(launch_envs("mpi", "tb-launch"), rc=1, stderr="rendezvous: MASTER_ADDR is not set"), {}
    )
    with pytest.raises(
        AssertionError,
        match=r"type: mpi, tb-launch, rendezvous probe: node 0 rank \*: exit 1: "
        r"rendezvous: MASTER_ADDR is not set",
    ):
        aml.test_type_mpi_rendezvous(target, job, "tb-launch")


def intel_job(rc, text):
    target, _ = azure_job(lambda node, cmd, env: (0, ""), {})
    return target, aml.Job(cluster(lambda node, cmd, env: (rc, "", text), kind="intelmpi"), target)


FIX = (
    "azureml_env_helper: OMPI_COMM_WORLD_RANK is not set: this helper maps Open MPI's variables; "
    "use tb-launch (or call trainbase_launch.apply()) under another MPI"
)


@pytest.mark.parametrize(
    "rc, text, why",
    [
        (0, "", "exited 0 without Open MPI's variables"),
        (1, "Traceback (most recent call last):\nKeyError: 'OMPI_COMM_WORLD_RANK'", "KeyError"),
        (1, "azureml_env_helper: OMPI_COMM_WORLD_RANK is not set", "no fix named"),
    ],
)
def test_the_guides_helper_under_another_mpi_must_stop_naming_the_fix(rc, text, why):
    target, job = intel_job(0 if rc == 0 else 1, FIX if rc == 0 else text)
    aml.test_type_mpi_rendezvous(*intel_job(1, FIX), "guides-helper")
    with pytest.raises(AssertionError, match=re.escape(why)):
        aml.test_type_mpi_rendezvous(target, job, "guides-helper")


# --------------------------------------------------------------------------- NCCL's version, the MPI launcher


class ImageTarget(DoctorTarget):
    """A DoctorTarget whose suite-side manifest (``components``) may differ from the doctor's."""

    def __init__(self, make_node, components):
        super().__init__(make_node)
        self.components = components

    def need_mpi(self):
        return None


def nccl_node(root, code):
    return lambda expect: FakeNode(root, expect=expect, libs={"libnccl.so.2": (FakeNccl(code), NCCL_PATH)})


def test_the_nccl_version_check_fails_on_another_nccl_than_the_manifest_s(tmp_path):
    want = {"nccl": {"version": "2.27.5"}}
    test_nccl.test_nccl_version(ImageTarget(nccl_node(tmp_path, 22705), want))
    with pytest.raises(
        AssertionError, match=r"the linker loads NCCL 2\.22\.3 from .*libnccl\.so\.2, the manifest says 2\.27\.5"
    ):
        test_nccl.test_nccl_version(ImageTarget(nccl_node(tmp_path, 22203), want))
    # the doctor content with its own manifest, the suite's names another NCCL
    with pytest.raises(AssertionError, match=r"'version': '2\.27\.5'"):
        test_nccl.test_nccl_version(ImageTarget(nccl_node(tmp_path, 22705), {"nccl": {"version": "2.28.3"}}))


def launcher_node(root, path_ok=True, version="4.1.4"):
    prefix = root / "opt" / "openmpi"
    mpirun, mpiexec = fake_mpi_launchers(prefix)
    from .doctor_fakes import MANIFEST

    manifest = {
        **MANIFEST,
        "components": {**MANIFEST["components"], "mpi": {"kind": "openmpi", "version": "4.1.4", "prefix": str(prefix)}},
    }
    answers = {
        f"{mpirun} --version": (0, f"mpirun (Open MPI) {version}\n"),
        f"{mpiexec} --version": (0, f"mpiexec (OpenRTE) {version}\n"),
        "bash -lc": (0, str(mpirun)),
    }
    env = {"PATH": str(mpirun.parent) if path_ok else str(root / "empty-bin")}
    return lambda expect: FakeNode(root, env=env, expect=expect, commands=answers, manifest=manifest)


@pytest.mark.parametrize("shell", ["non-login", "login"])
def test_the_launcher_check_fails_where_mpirun_is_not_on_path(tmp_path, shell):
    mpi = {"mpi": {"kind": "openmpi", "version": "4.1.4"}}
    test_mpi.test_launcher_runs_from_path(ImageTarget(launcher_node(tmp_path), mpi), shell)
    with pytest.raises(AssertionError, match=rf"in a {shell} shell: mpirun: command not found"):
        test_mpi.test_launcher_runs_from_path(ImageTarget(launcher_node(tmp_path, path_ok=False), mpi), shell)
    with pytest.raises(AssertionError, match=r"'version': '4\.1\.4'"):
        test_mpi.test_launcher_runs_from_path(
            ImageTarget(launcher_node(tmp_path), {"mpi": {"kind": "openmpi", "version": "4.1.5"}}), shell
        )
