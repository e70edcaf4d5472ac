"""The runtime tier's Charliecloud, rootless Podman, Apptainer, enroot and srun checks
(trainbase_conformance/checks/test_runtime.py) run unchanged with the runtime (and Slurm)
replaced by what it printed for a given image, so each is shown failing for its own reason
without unpacking an image: a healthy image's two ranks pass; an image that finds its MPI only
through its ENV (bare `ch-run` does not apply it), one whose entrypoint needs root at start-up
(`--userns=keep-id` and enroot run it as the user), one that writes to its root at start-up
(a SIF is read-only) and an MPI that makes a world of one per srun task each fail, naming the
way they were started and what the runtime said."""

from __future__ import annotations

import json
import subprocess

import pytest

from trainbase_conformance import runtimes
from trainbase_conformance.checks import test_runtime as rt

from .framework_fakes import PREFIX, FakeTarget

USER = "tbconf"


def world(n: int = 2) -> str:
    """probes/runtime_world.py's lines for a healthy n-rank job in the image's Python."""
    return "".join(
        "TBWORLD "
        + json.dumps(
            {
                "rank": r,
                "size": n,
                "allreduce": n * (n + 1) // 2,
                "allreduce_ok": True,
                "uid": 1000,
                "user": USER,
                "python": f"{PREFIX}/bin/python3",
                "prefix": PREFIX,
                "launch": {"launcher": "openmpi", "rank": r, "world_size": n, "local_rank": r, "node_rank": 0},
            }
        )
        + "\n"
        for r in range(n)
    )


def runtime(monkeypatch, answer):
    """runtimes.as_user answered by ``answer(argv) -> (exit code, stdout, stderr)``."""

    def as_user(user, argv, env=None, timeout=300, cwd="/"):
        assert user == USER
        return subprocess.CompletedProcess(argv, *answer(argv))

    monkeypatch.setattr(runtimes, "as_user", as_user)


def healthy(argv):
    return (0, world(), "") if "runtime_world.py" in argv[-1] else (0, '{"checks": []}\n', "")


@pytest.mark.parametrize("set_env", [True, False])
def test_bare_ch_run_fails_on_an_image_whose_mpi_is_found_only_through_its_env(monkeypatch, set_env):
    runtime(monkeypatch, healthy)
    rt.test_charliecloud_as_user(FakeTarget({}), ("/var/tmp/tbconf-ch/img", "/tmp/probes"), USER, set_env)

    def env_only(argv):
        if "--set-env" not in argv and "mpirun" in argv[-1]:
            return 127, "", "sh: 1: mpirun: not found\n"
        return healthy(argv)

    runtime(monkeypatch, env_only)
    if set_env:  # with the image's ENV applied, the same image runs
        return rt.test_charliecloud_as_user(FakeTarget({}), ("/var/tmp/tbconf-ch/img", "/tmp/probes"), USER, set_env)
    with pytest.raises(AssertionError, match=r"ch-run \(bare\) as tbconf: exit 127: sh: 1: mpirun: not found"):
        rt.test_charliecloud_as_user(FakeTarget({}), ("/var/tmp/tbconf-ch/img", "/tmp/probes"), USER, set_env)


@pytest.mark.parametrize("way", sorted(rt.PODMAN_WAYS))
def test_podman_keep_id_fails_on_an_image_that_needs_root_at_start_up(monkeypatch, way):
    runtime(monkeypatch, healthy)
    rt.test_podman_rootless_as_user(FakeTarget({}), "localhost/tbconf:img", USER, "/tmp/probes", way)

    def root_entrypoint(argv):
        if "--userns=keep-id" in argv:  # the user's own uid inside: /etc is not theirs
            return 1, "", "/usr/local/bin/entrypoint.sh: 4: cannot create /etc/profile.d/job.sh: Permission denied\n"
        return healthy(argv)

    runtime(monkeypatch, root_entrypoint)
    if way == "podman-rootless":  # container root mapped onto the user may write /etc
        return rt.test_podman_rootless_as_user(FakeTarget({}), "localhost/tbconf:img", USER, "/tmp/probes", way)
    with pytest.raises(
        AssertionError,
        match=r"podman-rootless-keep-id as tbconf: exit 1: /usr/local/bin/entrypoint\.sh: "
        r"4: cannot create /etc/profile\.d/job\.sh: Permission denied",
    ):
        rt.test_podman_rootless_as_user(FakeTarget({}), "localhost/tbconf:img", USER, "/tmp/probes", way)


# ----------------------------------------------------------------------------- Apptainer, enroot, srun
# Not installed here (the runtime tier skips them, naming what is missing): their checks are shown
# failing the same way, with the runtime's and Slurm's answers replaced.


class FakeSlurm:
    """A one-node Slurm that offers every --mpi plugin; `srun` answered by ``answer(args)``."""

    def __init__(self, answer):
        self.answer, self.steps = answer, []

    def mpi_plugins(self) -> list[str]:
        return ["none", "pmi2", "pmix"]

    def srun(self, args, *, user=None, timeout=300, env=None):
        assert user == USER
        self.steps.append(args)
        return subprocess.CompletedProcess(args, *self.answer(args))


def singletons(args):
    """What an MPI built without the PMI srun offers does: each task MPI_Init's world of its own."""
    one = world(1)
    return 0, one + one, ""


@pytest.mark.parametrize("clean", [False, True])
def test_apptainer_fails_on_an_image_that_writes_to_its_root_at_start_up(monkeypatch, clean):
    runtime(monkeypatch, healthy)
    rt.test_apptainer_as_user(FakeTarget({}), "/tmp/tbconf-sif/img.sif", USER, "/tmp/probes", clean)
    runtime(
        monkeypatch,
        lambda argv: (1, "", "sh: 1: cannot create /etc/openmpi/openmpi-mca-params.conf: Read-only file system\n"),
    )
    flags = " --cleanenv" if clean else " "
    with pytest.raises(
        AssertionError,
        match=rf"apptainer exec{flags}: exit 1: sh: 1: cannot create "
        r"/etc/openmpi/openmpi-mca-params\.conf: Read-only file system",
    ):
        rt.test_apptainer_as_user(FakeTarget({}), "/tmp/tbconf-sif/img.sif", USER, "/tmp/probes", clean)


@pytest.mark.parametrize("sharens", [True, False])
def test_srun_apptainer_fails_when_every_task_is_a_world_of_one(sharens):
    slurm = FakeSlurm(lambda args: (0, world(), ""))
    rt.test_srun_apptainer(FakeTarget({}), "/tmp/tbconf-sif/img.sif", USER, "/tmp/probes", slurm, sharens)
    assert [a[2] for a in slurm.steps] == ["--mpi=pmix"]  # the one PMI Open MPI and this Slurm share
    with pytest.raises(
        AssertionError,
        match=r"srun --mpi=pmix apptainer exec( --sharens)?: MPI ranks "
        r"\[\(0, 1\), \(0, 1\)\], want 0\.\.1 of 2",
    ):
        rt.test_srun_apptainer(
            FakeTarget({}), "/tmp/tbconf-sif/img.sif", USER, "/tmp/probes", FakeSlurm(singletons), sharens
        )


def test_enroot_fails_on_an_image_that_needs_root_at_start_up(monkeypatch):
    container = ("tbconf-img", {"ENROOT_DATA_PATH": "/home/tbconf/.tbconf-enroot/data"})
    runtime(monkeypatch, healthy)
    rt.test_enroot_as_user(FakeTarget({}), container, USER, "/tmp/probes")
    runtime(
        monkeypatch,
        lambda argv: (
            1,
            "",
            "/usr/local/bin/entrypoint.sh: 4: cannot create /etc/profile.d/job.sh: Permission denied\n",
        ),
    )
    with pytest.raises(
        AssertionError,
        match=r"enroot start: exit 1: /usr/local/bin/entrypoint\.sh: 4: cannot create "
        r"/etc/profile\.d/job\.sh: Permission denied",
    ):
        rt.test_enroot_as_user(FakeTarget({}), container, USER, "/tmp/probes")


def test_srun_enroot_fails_when_every_task_is_a_world_of_one():
    container = ("tbconf-img", {"ENROOT_DATA_PATH": "/home/tbconf/.tbconf-enroot/data"})
    rt.test_srun_enroot(FakeTarget({}), container, USER, "/tmp/probes", FakeSlurm(lambda args: (0, world(), "")))
    with pytest.raises(
        AssertionError,
        match=r"srun --mpi=pmix enroot start: MPI ranks \[\(0, 1\), \(0, 1\)\], "
        r"want 0\.\.1 of 2",
    ):
        rt.test_srun_enroot(FakeTarget({}), container, USER, "/tmp/probes", FakeSlurm(singletons))


# ----------------------------------------------------------------------------- each assert, its own defect


def system_python(argv):
    """An image whose PATH puts Debian's python3 first: MPI runs, the framework is not there."""
    if "runtime_world.py" in argv[-1]:
        return (
            0,
            world()
            .replace(f'"prefix": "{PREFIX}"', '"prefix": "/usr"')
            .replace(f"{PREFIX}/bin/python3", "/usr/bin/python3"),
            "",
        )
    return healthy(argv)


@pytest.mark.parametrize(
    "answer, message",
    [
        (
            system_python,
            r"ch-run --set-env as tbconf: python3 is not the image's \(/opt/trainbase/venv\): "
            r"\['/usr/bin/python3', '/usr/bin/python3'\]",
        ),
        # the tools are not on the image's PATH under ch-run (installed in /root/.local)
        (
            lambda argv: (
                (127, "", "sh: 1: tb-launch: not found\n") if argv[-1] == "tb-launch --json" else healthy(argv)
            ),
            r"ch-run --set-env as tbconf: `tb-launch --json` exited 127: sh: 1: tb-launch: not found",
        ),
    ],
    ids=["system-python", "no-tb-launch"],
)
def test_charliecloud_fails_on_each_defect(monkeypatch, answer, message):
    runtime(monkeypatch, answer)
    with pytest.raises(AssertionError, match=message):
        rt.test_charliecloud_as_user(FakeTarget({}), ("/var/tmp/tbconf-ch/img", "/tmp/probes"), USER, True)


def doctor_answering(rc: int, checks: list[dict], stderr: str = ""):
    def answer(argv):
        if "tb-doctor --json" in argv[-1]:
            return rc, json.dumps({"checks": checks}) + "\n" if checks is not None else "", stderr
        return healthy(argv)

    return answer


@pytest.mark.parametrize(
    "answer, message",
    [
        (system_python, r"podman-rootless: python3 is not the image's: \['/usr/bin/python3', '/usr/bin/python3'\]"),
        # tb-doctor itself crashed (a traceback, exit 2), not a verdict of 0 or 1
        (
            doctor_answering(2, None, "Traceback (most recent call last):\nKeyError: 'HOME'\n"),
            r"podman-rootless: tb-doctor exited 2: Traceback \(most recent call last\):\n\s*KeyError: 'HOME'",
        ),
        (
            doctor_answering(1, [{"id": "node.shm", "status": "fail", "summary": "/dev/shm is 64 MB"}]),
            r"podman-rootless: tb-doctor fails: \['node\.shm: /dev/shm is 64 MB'\]",
        ),
    ],
    ids=["system-python", "doctor-crashed", "doctor-fails"],
)
def test_podman_fails_on_each_defect(monkeypatch, answer, message):
    runtime(monkeypatch, answer)
    with pytest.raises(AssertionError, match=message):
        rt.test_podman_rootless_as_user(FakeTarget({}), "localhost/tbconf:img", USER, "/tmp/probes", "podman-rootless")
