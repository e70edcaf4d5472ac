"""tb-doctor where clusters run (issue 22): `srun` without a PMI the MPI can reach (every task a
one-rank world of its own), ranks of one node in separate user namespaces (Charliecloud without
--join, Apptainer without --sharens, one enroot container per task), a read-only root without a
writable temporary directory, and a container runtime that keeps the host's PATH."""

import json
import os
import sys

import jsonschema
import pytest

from .conftest import ROOT
from .doctor_fakes import MANIFEST, FakeNode, core, result

cli = __import__("trainbase_doctor.cli", fromlist=["x"])
cluster = __import__("trainbase_doctor.cluster", fromlist=["x"])
checks_node = __import__("trainbase_doctor.checks_node", fromlist=["x"])
SCHEMA = json.loads((ROOT / "docs" / "doctor.schema.json").read_text())
LAUNCH_VARS = (
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "PMI_SIZE",
    "PMI_RANK",
    "PMIX_RANK",
    "PMIX_NAMESPACE",
    "MPI_LOCALRANKID",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "TMPDIR",
    "TMP",
    "TEMP",
)


def fake_mpi(monkeypatch, size: int, others: list | None = None) -> None:
    """mpi4py whose COMM_WORLD is this process as rank 0 of ``size`` ranks; gather returns this
    rank's report followed by ``others``."""

    class Comm:
        def Get_rank(self):
            return 0

        def Get_size(self):
            return size

        def gather(self, obj, root=0):
            return [obj, *(others or [])]

        def bcast(self, obj, root=0):
            return obj

    class MPI:
        COMM_WORLD = Comm()

    monkeypatch.setitem(sys.modules, "mpi4py", type("m", (), {"MPI": MPI}))
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", MPI)


def clean_env(monkeypatch, **env):
    for k in LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


# --- 1. srun --mpi=none: two singletons must not pass as a cluster ------------------------------


def test_cluster_under_srun_without_pmi_fails_naming_the_cause(monkeypatch, capsys):
    """srun --mpi=none -n 2: each task's MPI_Init makes a world of 1. Before: "1 node, 1 rank",
    exit 0, on every task."""
    clean_env(monkeypatch, SLURM_NTASKS="2", SLURM_PROCID="1", SLURM_LOCALID="1")
    fake_mpi(monkeypatch, size=1)
    code = cli.main(["--cluster", "--only", "node.mounts", "--json"])
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert code == 1 and doc["exit_code"] == 1 and doc["summary"]["fail"] >= 1
    world = next(c for c in doc["ranks"][0]["checks"] if c["id"] == "cluster.world")
    assert world["status"] == "fail" and "SLURM_NTASKS=2" in world["summary"] and "1 rank" in world["summary"]
    assert "--mpi=pmix" in world["hint"] and "--mpi=pmi2" in world["hint"]
    assert world["facts"] == {"mpi_size": 1, "expected": 2, "source": "SLURM_NTASKS", "said": {"SLURM_NTASKS": 2}}
    assert cli.main(["--cluster", "--only", "node.mounts"]) == 1
    text = capsys.readouterr().out
    assert "expected 2" in text and "FAIL" in text and "fix: " in text and "--mpi=pmix" in text


def test_cluster_with_the_whole_world_passes(monkeypatch, capsys):
    clean_env(monkeypatch, SLURM_NTASKS="2", SLURM_PROCID="0", PMIX_RANK="0", PMIX_NAMESPACE="slurm.pmix.7.0")
    fake_mpi(monkeypatch, size=2)
    assert cli.main(["--cluster", "--only", "node.mounts", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    world = next(c for c in doc["ranks"][0]["checks"] if c["id"] == "cluster.world")
    assert world["status"] == "ok" and "2 rank(s)" in world["summary"]
    ns = next(c for c in doc["ranks"][0]["checks"] if c["id"] == "cluster.userns")
    assert ns["facts"]["userns"] == os.readlink("/proc/self/ns/user")


@pytest.mark.parametrize(
    "env,size,status,words",
    [
        # srun --mpi=none (or MpiDefault=none): Slurm's count, no PMI at all
        ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0"}, 1, "fail", ["SLURM_NTASKS=2", "no PMI"]),
        # srun --mpi=pmi2 with Open MPI 5, which speaks PMIx only (open-mpi/ompi#13523)
        (
            {"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "PMI_SIZE": "2", "PMI_RANK": "0"},
            1,
            "fail",
            ["PMI_SIZE=2", "PMI-2", "PMIx only"],
        ),
        # srun --mpi=pmix with an MPI that did not use it
        (
            {"SLURM_NTASKS": "4", "SLURM_PROCID": "0", "PMIX_RANK": "0", "PMIX_NAMESPACE": "slurm.pmix.3.0"},
            1,
            "fail",
            ["SLURM_NTASKS=4", "PMIx", "did not use it"],
        ),
        # mpirun started 4 ranks but the process's MPI is not the launcher's
        ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"}, 1, "fail", ["OMPI_COMM_WORLD_SIZE=4", "mpirun"]),
        # Hydra (Intel MPI's mpiexec)
        ({"PMI_SIZE": "8", "PMI_RANK": "0", "MPI_LOCALRANKID": "0"}, 1, "fail", ["PMI_SIZE=8", "Hydra"]),
        ({"PMI_SIZE": "8", "PMI_RANK": "0", "MPI_LOCALRANKID": "0"}, 8, "ok", ["8 rank(s)", "PMI_SIZE"]),
        # WORLD_SIZE only (a job spec, torchrun): MPI was not launched by an MPI launcher
        ({"WORLD_SIZE": "2", "RANK": "0"}, 1, "fail", ["WORLD_SIZE=2"]),
        # mpirun -np 4 inside an sbatch script of 16 tasks: mpirun's count wins over the batch step's
        (
            {"OMPI_COMM_WORLD_SIZE": "4", "SLURM_NTASKS": "16", "SLURM_PROCID": "0"},
            4,
            "ok",
            ["4 rank(s)", "OMPI_COMM_WORLD_SIZE"],
        ),
        ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "PMIX_RANK": "0"}, 2, "ok", ["2 rank(s)"]),
        ({}, 1, "ok", ["no launcher variable"]),
        ({"SLURM_NTASKS": "two"}, 1, "ok", ["no launcher variable"]),
    ],
)
def test_world_size_decision(env, size, status, words):
    entry = cluster.world_check(size, env)
    assert entry["status"] == status, entry
    for w in words:
        assert w in entry["summary"] + " " + entry["hint"], (w, entry)
    if status == "fail":
        assert entry["hint"] and "\n" not in entry["hint"] and entry["facts"]["mpi_size"] == size
        which = entry["facts"]["source"]
        assert f"{which}={env[which]}" in entry["summary"]


# --- 2. ranks of one node in separate user namespaces ---------------------------------------------


def rank(host: str, r: int, ns: str | None) -> dict:
    node = FakeNode("/nonexistent-tb-doctor-root", manifest=None)  # writes nothing; node.mounts only
    rep = cli.node_report(node, core.run_checks(node, [core.CHECKS["node.mounts"]]), 0.1)
    rep["node"].update(hostname=host, rank=r)
    return cluster.with_check(rep, cluster.userns_entry(ns))


def test_user_namespaces_split_per_node():
    reports = [
        rank("a", 0, "user:[4026532001]"),
        rank("a", 1, "user:[4026532002]"),
        rank("a", 2, "user:[4026532001]"),
        rank("b", 3, "user:[4026531837]"),
        rank("b", 4, "user:[4026531837]"),
        rank("c", 5, "user:[4026532001]"),
        rank("c", 6, None),
    ]  # unreadable: not counted
    split = cluster.userns_split(reports)
    assert split == [{"hostname": "a", "namespaces": {"user:[4026532001]": [0, 2], "user:[4026532002]": [1]}}]
    # the same identity on two hosts means nothing: namespaces are compared within a node
    assert cluster.userns_split([rank("a", 0, "user:[1]"), rank("b", 1, "user:[2]")]) == []


def test_ranks_of_a_node_in_two_user_namespaces_warn_that_node_with_the_fix(monkeypatch):
    reports = [
        rank("a", 0, "user:[4026532001]"),
        rank("a", 1, "user:[4026532002]"),
        rank("b", 2, "user:[4026531837]"),
        rank("b", 3, "user:[4026531837]"),
    ]
    agg = cluster.aggregate(reports)
    by = {n["hostname"]: n for n in agg["nodes"]}
    assert by["a"]["status"]["cluster.userns"] == "warn" and by["b"]["status"]["cluster.userns"] == "ok"
    entry = next(c for c in reports[1]["checks"] if c["id"] == "cluster.userns")
    assert entry["status"] == "warn" and reports[1]["summary"]["warn"] == 1
    assert "2 user namespaces" in entry["summary"] and "cross-memory attach" in entry["summary"]
    for fix in ("ch-run --join", "--sharens", "one container per node"):
        assert fix in entry["hint"], fix
    text = cluster.render(agg, 4, None)
    assert "warnings:" in text and "a: " in text and "ch-run --join" in text
    assert [ln.split()[0] for ln in text.splitlines() if ln.startswith(("a ", "b "))] == ["a", "b"]
    # a warning, not a failure: the job runs (slower, or UCX aborts: the text says so)
    fake_mpi(monkeypatch, size=4, others=reports[1:])
    clean_env(monkeypatch, OMPI_COMM_WORLD_SIZE="4")
    monkeypatch.setattr(cluster, "user_namespace", lambda: "user:[4026532001]")
    res, text, code = cluster.run(reports[0], None, 8)
    jsonschema.validate(res, SCHEMA)
    assert code == 0 and res["nodes"][0]["status"]["cluster.userns"] == "warn" and "ch-run --join" in text


# --- 3. a read-only root without a writable temporary directory -----------------------------------


def test_unwritable_tmp_fails_naming_the_directory_and_the_fix(tmp_path):
    r = result(FakeNode(tmp_path, unwritable={"/tmp": "EROFS: Read-only file system"}), "node.tmpdir")
    assert r.status == core.FAIL and "/tmp is not writable" in r.summary and "EROFS" in r.summary
    assert "PMIx" in r.summary and "TMPDIR=/dev/shm" in r.hint and "--tmpfs /tmp" in r.hint
    assert r.facts == {"tmpdir": "/tmp", "from": None, "writable": False, "error": "EROFS: Read-only file system"}
    r = result(
        FakeNode(
            tmp_path, env={"TMPDIR": "/scratch/x"}, unwritable={"/scratch/x": "ENOENT: No such file or directory)"}
        ),
        "node.tmpdir",
    )
    assert r.status == core.FAIL and "TMPDIR=/scratch/x is not writable" in r.summary and "ENOENT" in r.summary
    both = FakeNode(tmp_path, unwritable={"/tmp": "EROFS: x", "/dev/shm": "EROFS: x"})
    assert "not writable here either" in result(both, "node.tmpdir").hint


def test_writable_tmpdir_passes(tmp_path):
    r = result(FakeNode(tmp_path), "node.tmpdir")
    assert r.status == core.OK and r.summary.startswith("/tmp is writable")
    r = result(FakeNode(tmp_path, env={"TEMP": "/dev/shm"}, unwritable={"/tmp": "EROFS: x"}), "node.tmpdir")
    assert r.status == core.OK and "TEMP=/dev/shm" in r.summary and r.facts["from"] == "TEMP"


def test_the_real_writability_probe(tmp_path):
    node = core.Node(root=tmp_path)
    (tmp_path / "tmp").mkdir()
    assert node.unwritable("/tmp") == "" and list((tmp_path / "tmp").iterdir()) == []
    assert node.unwritable("/missing").startswith("ENOENT")
    (tmp_path / "file").write_text("")
    assert node.unwritable("/file").startswith("ENOTDIR")


# --- 4. a runtime that keeps the host's PATH (bare ch-run, enroot) --------------------------------


def host_bin(tmp_path, *names):
    d = tmp_path / "host" / "bin"
    d.mkdir(parents=True, exist_ok=True)
    for n in names:
        (d / n).write_text("#!/bin/sh\n")
        (d / n).chmod(0o755)
    return d


@pytest.mark.parametrize("host_tools", [(), ("mpirun", "mpiexec", "python3")])
def test_launcher_hint_names_the_runtime_fix_when_the_path_is_the_hosts(tmp_path, host_tools):
    """Bare `ch-run DIR -- tb-doctor`: PATH is the host's. Either no mpirun at all, or the host's
    own MPI and python3 come first."""
    d = host_bin(tmp_path, *host_tools)
    r = result(FakeNode(tmp_path, env={"PATH": f"{d}:/nonexistent"}), "mpi.launcher")
    assert r.status == core.FAIL
    for fix in ("ch-run --set-env", "enroot", "/etc/environment", "/opt/openmpi/bin"):
        assert fix in r.hint, fix
    assert "\n" not in r.hint
    assert "PATH lacks the image's /opt/openmpi/bin and /opt/trainbase/venv/bin" in r.summary
    if host_tools:
        assert "not under the manifest's MPI prefix" in r.summary
        assert f"python3 on this PATH is {d}/python3, not the image's /opt/trainbase/venv/bin/python3" in r.summary
        assert r.facts["python3"] == f"{d}/python3"


def test_launcher_hint_without_a_path_problem_is_unchanged(tmp_path):
    """A wrong version is the image's problem, not the runtime's: no ch-run in that hint."""
    prefix = tmp_path / "opt" / "openmpi"
    host_bin(tmp_path)
    (prefix / "bin").mkdir(parents=True)
    for n in ("mpirun", "mpiexec"):
        (prefix / "bin" / n).write_text("#!/bin/sh\n")
        (prefix / "bin" / n).chmod(0o755)
    manifest = {
        **MANIFEST,
        "components": {**MANIFEST["components"], "mpi": {"kind": "openmpi", "version": "4.1.4", "prefix": str(prefix)}},
    }
    answers = {f"{prefix}/bin/mpirun --version": (0, "mpirun (Open MPI) 3.1.2\n")}
    r = result(
        FakeNode(tmp_path, env={"PATH": str(prefix / "bin")}, commands=answers, manifest=manifest), "mpi.launcher"
    )
    assert r.status == core.FAIL and "reports 3.1.2" in r.summary and "ch-run" not in r.hint
    assert "PATH lacks" not in r.summary


def test_rootless_podman_uses_runc_where_crun_refuses_the_hybrid_cgroup_layout(tmp_path, monkeypatch):
    """A hybrid cgroup host whose cgroup2 part holds a controller (hugetlb, mounted by no v1
    hierarchy) makes crun refuse every container; the suite's Podman runs then ask for runc."""
    from trainbase_conformance import runtimes

    monkeypatch.setattr(runtimes.shutil, "which", lambda name: f"/usr/bin/{name}")
    (tmp_path / "cgroup.controllers").write_text("hugetlb\n")
    assert runtimes.podman_oci_runtime(tmp_path) == ["--runtime", "runc"]
    (tmp_path / "cgroup.controllers").write_text("\n")
    assert runtimes.podman_oci_runtime(tmp_path) == []
    assert runtimes.podman_oci_runtime(tmp_path / "absent") == []  # pure v1 or pure v2: Podman's choice


def _mounts(node, *lines):
    node.write("/proc/self/mountinfo", "\n".join(lines))
    return node


def test_a_noexec_tmpdir_warns_naming_what_cannot_load_and_the_fix(tmp_path):
    # Docker's `--tmpfs /tmp` (noexec by default) under a read-only root: writable, but nothing
    # a JIT compiles there can be loaded (measured: torch.compile as an arbitrary uid, issue 62)
    node = _mounts(
        FakeNode(tmp_path),
        "1 0 0:1 / / ro,relatime - overlay overlay ro",
        "2 1 0:2 / /tmp rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw",
        "3 1 0:3 / /tmpx rw,relatime - tmpfs tmpfs rw",
    )
    r = result(node, "node.tmpdir")
    assert r.status == core.WARN and r.summary.startswith("/tmp is writable but mounted noexec")
    assert "failed to map segment" in r.summary and "--tmpfs /tmp:exec" in r.hint and "TRITON_CACHE_DIR" in r.hint
    assert r.facts["noexec"] is True and r.facts["writable"] is True
    # the longest mount point holding TMPDIR decides, not a sibling whose name starts alike
    r = result(
        _mounts(FakeNode(tmp_path, env={"TMPDIR": "/tmpx/job"}), *node.read("/proc/self/mountinfo").splitlines()),
        "node.tmpdir",
    )
    assert r.status == core.OK and r.facts["noexec"] is False


def test_an_exec_tmpdir_under_a_noexec_root_passes(tmp_path):
    node = _mounts(
        FakeNode(tmp_path),
        "1 0 0:1 / / rw,noexec - overlay overlay rw",
        "2 1 0:2 / /tmp rw,nosuid,nodev - tmpfs tmpfs rw",
    )
    r = result(node, "node.tmpdir")
    assert r.status == core.OK and r.facts["noexec"] is False
    assert checks_node.mount_options(node, "/var/x") == {"rw", "noexec"}
    assert checks_node.mount_options(node, "/tmp/a/b") == {"rw", "nosuid", "nodev"}
