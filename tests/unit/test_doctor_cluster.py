"""tb-doctor --cluster on synthetic rank reports: the node x check table, the odd node out,
and both JSON documents against the published schema (docs/doctor.schema.json). And the suite's
two cluster checks on that same gathering: each fails on a doctor that skips the comparison or
on an all-reduce with wrong values."""

import json
import sys
from contextlib import contextmanager
from dataclasses import replace
from types import SimpleNamespace

import jsonschema
import pytest

from trainbase_conformance.checks import test_doctor as checks

from .conftest import ROOT
from .doctor_fakes import FakeNode, core

cli = __import__("trainbase_doctor.cli", fromlist=["x"])
cluster = __import__("trainbase_doctor.cluster", fromlist=["x"])
SCHEMA = json.loads((ROOT / "docs" / "doctor.schema.json").read_text())


def rank_report(tmp_path, host, rank, mounts=("/data", "/dev/shm"), driver="580.65.06", fail_shm=False):
    """A rank's real node report (the real checks on a fake node), with a few facts set."""
    node = FakeNode(tmp_path / host, env={"PATH": "/nonexistent"}, shm=(64 << 20) if fail_shm else 8 << 30)
    node.write("/proc/self/mountinfo", "\n".join(f"{i} 1 0:1 / {m} rw - x x rw" for i, m in enumerate(mounts)))
    results = core.run_checks(node, list(core.CHECKS.values()))
    for r in results:
        if r.id == "gpu.driver":
            r.facts["driver_version"] = driver
    rep = cli.node_report(node, results, 0.5)
    rep["node"].update(hostname=host, rank=rank)
    return rep


def test_node_report_validates_against_the_schema(tmp_path):
    rep = rank_report(tmp_path, "a", 0)
    jsonschema.validate(rep, SCHEMA)
    assert rep["exit_code"] == 1  # no launcher and no NCCL on the fake node
    bad = json.loads(json.dumps(rep))
    bad["checks"][0]["status"] = "fine"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)
    no_hint = json.loads(json.dumps(rep))
    failing = next(c for c in no_hint["checks"] if c["status"] == "fail")
    failing["hint"] = ""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(no_hint, SCHEMA)


def test_the_node_without_a_mount_is_the_odd_one_out(tmp_path):
    reports = [
        rank_report(tmp_path, "a", 0),
        rank_report(tmp_path, "a", 1),
        rank_report(tmp_path, "b", 2, mounts=("/dev/shm",)),
        rank_report(tmp_path, "b", 3, mounts=("/dev/shm",)),
    ]
    agg = cluster.aggregate(reports)
    assert [n["hostname"] for n in agg["nodes"]] == ["a", "b"]
    assert [n["ranks"] for n in agg["nodes"]] == [[0, 1], [2, 3]]
    mounts = [d for d in agg["differences"] if d["check"] == "node.mounts"]
    assert mounts == [
        {
            "check": "node.mounts",
            "fact": "mounts",
            "nodes": ["b"],
            "summary": "node.mounts: mounts /data missing on b (present on a)",
        }
    ]
    text = cluster.render(agg, 4, None)
    assert text.count("tb-doctor:") == 1 and "odd one out:" in text
    assert "mounts /data missing on b" in text
    rows = [ln for ln in text.splitlines() if ln.startswith(("a ", "b "))]
    assert len(rows) == 2 and rows[0].split()[1] == "0-1" and rows[1].split()[1] == "2-3"


def test_majority_names_the_odd_driver_and_a_check_failing_on_one_node(tmp_path):
    reports = [
        rank_report(tmp_path, h, i, driver="575.51.03" if h == "c" else "580.65.06", fail_shm=h == "c")
        for i, h in enumerate("abc")
    ]
    for r in reports:
        r["node"]["local_rank"] = 0
    agg = cluster.aggregate(reports)
    by = {(d["check"], d["fact"]): d for d in agg["differences"]}
    assert by[("gpu.driver", "driver_version")]["nodes"] == ["c"]
    assert "the other 2 node(s): 580.65.06" in by[("gpu.driver", "driver_version")]["summary"]
    assert by[("mem.shm", "size_bytes")]["nodes"] == ["c"]
    assert all(d["nodes"] != ["a"] and d["nodes"] != ["b"] for d in agg["differences"])


def test_equal_nodes_have_no_differences(tmp_path):
    agg = cluster.aggregate([rank_report(tmp_path, h, i) for i, h in enumerate("ab")])
    assert agg["differences"] == []


def test_cluster_report_validates_against_the_schema(tmp_path, monkeypatch):
    reports = [rank_report(tmp_path, "a", 0), rank_report(tmp_path, "b", 1, mounts=())]

    class Comm:  # one process standing in for rank 0 of a 2-rank world
        def Get_rank(self):
            return 0

        def Get_size(self):
            return 2

        def gather(self, obj, root=0):
            return reports if obj is reports[0] else [obj, obj]

        def bcast(self, obj, root=0):
            return obj

    class MPI:
        COMM_WORLD = Comm()

    monkeypatch.setitem(__import__("sys").modules, "mpi4py", type("m", (), {"MPI": MPI}))
    monkeypatch.setitem(__import__("sys").modules, "mpi4py.MPI", MPI)
    result, text, code = cluster.run(reports[0], None, 8)
    jsonschema.validate(result, SCHEMA)
    assert code == 1 and result["differences"] and "missing on b" in text
    coll = {
        "backend": "mpi",
        "ranks": 2,
        "bytes": 8 << 20,
        "ok": True,
        "error": "",
        "seconds": 0.01,
        **cluster._bandwidth(8 << 20, 0.01, 2),
    }
    jsonschema.validate({**result, "allreduce": coll}, SCHEMA)
    assert coll["busbw_GBps"] == pytest.approx(coll["algbw_GBps"])  # 2 ranks: busbw = algbw * 2(n-1)/n
    assert "values correct" in cluster.describe_collective(coll)


def test_a_singleton_world_under_srun_fails_the_cluster_verdict(tmp_path):
    """srun --mpi=none -n 2 (issue 22): every task is rank 0 of a world of 1 and prints its own
    table; each must fail, saying how many ranks the launch started and why they never met."""
    rep = cluster.with_check(
        rank_report(tmp_path, "a", 0), cluster.world_check(1, {"SLURM_NTASKS": "2", "SLURM_PROCID": "0"})
    )
    assert rep["exit_code"] == 1 and rep["summary"]["fail"] >= 1
    jsonschema.validate(rep, SCHEMA)
    agg = cluster.aggregate([rep])
    assert agg["nodes"][0]["status"]["cluster.world"] == "fail"
    text = cluster.render(agg, 1, None)
    assert text.splitlines()[0] == "tb-doctor: 1 node(s), 1 rank(s), expected 2 (SLURM_NTASKS)"
    assert "cluster.world: MPI's world has 1 rank" in text and "--mpi=pmix" in text
    assert "world" in text.splitlines()[1].split()


# ----------------------------------------------------------------------------- the suite's cluster checks
# The two multinode doctor checks of the suite (trainbase_conformance/checks/test_doctor.py) run
# unchanged against this doctor's own gathering, table and collective verdict (cluster.run on 4
# rank reports of 2 fake nodes, one MPI process standing in for rank 0), with the cluster the
# suite would start replaced by one whose launcher prints what cluster.run returns.


class FourRanks:
    """mpi4py's COMM_WORLD seen from rank 0 of 4: gather hands rank 0 every rank's report (or
    4 copies of a collective's result)."""

    def __init__(self, reports):
        self.reports = reports

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 4

    def gather(self, obj, root=0):
        return self.reports if obj is self.reports[0] else [obj] * 4

    def bcast(self, obj, root=0):
        return obj


def doctor_cluster(monkeypatch, reports, allreduce_ok=True):
    """A start_cluster for the suite's check: its launcher runs this doctor's cluster.run on
    ``reports`` and prints the table or the JSON, as rank 0 does, with its exit code."""
    mpi = type("MPI", (), {})
    monkeypatch.setitem(sys.modules, "mpi4py", type("m", (), {"MPI": mpi}))
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    transport = lambda *a, **k: (allreduce_ok, 0.004)  # noqa: E731 -- every element checked, or not
    monkeypatch.setattr(cluster, "mpi_allreduce", transport)
    monkeypatch.setattr(cluster, "torch_allreduce", transport)

    def launch(per_host, cmd, timeout=180):
        backend = next((b for b in ("mpi", "gloo") if f"--allreduce {b}" in cmd), None)
        mpi.COMM_WORLD = FourRanks(json.loads(json.dumps(reports)))  # each launch: fresh ranks
        result, text, code = cluster.run(mpi.COMM_WORLD.reports[0], backend, 8, env={})
        return SimpleNamespace(
            returncode=code, stdout=json.dumps(result) if "--json" in cmd else text + "\n", stderr=""
        )

    @contextmanager
    def start_cluster(target, caps, extra=None):
        yield SimpleNamespace(hosts=["a", "b"], launch=launch)

    monkeypatch.setattr(checks, "start_cluster", start_cluster)


def four_ranks(tmp_path, b_mounts=("/dev/shm",)):
    return [
        rank_report(tmp_path, "a", 0),
        rank_report(tmp_path, "a", 1),
        rank_report(tmp_path, "b", 2, mounts=b_mounts),
        rank_report(tmp_path, "b", 3, mounts=b_mounts),
    ]


def test_the_suite_s_mount_check_fails_on_a_doctor_that_does_not_compare_mounts(tmp_path, monkeypatch):
    doctor_cluster(monkeypatch, four_ranks(tmp_path))
    checks.test_doctor_cluster_names_the_node_without_the_mount(None, None)
    # the defect: node.mounts no longer compared across nodes (its compare facts dropped)
    monkeypatch.setitem(core.CHECKS, "node.mounts", replace(core.CHECKS["node.mounts"], compare=()))
    with pytest.raises(
        AssertionError, match=r"the table does not name b's missing /data:\n\s*tb-doctor: 2 node\(s\), 4 rank"
    ):
        checks.test_doctor_cluster_names_the_node_without_the_mount(None, None)


def test_the_suite_s_torch_allreduce_check_fails_on_wrong_values(tmp_path, monkeypatch):
    """The doctor's own checks limited to image and launch (as the check runs it: --only)."""
    only = [core.CHECKS["image.manifest"], core.CHECKS["launch.contract"]]
    monkeypatch.setattr(core, "CHECKS", {c.id: c for c in only})
    target = type("T", (), {"manifest": {"frameworks": {"pytorch": "2.10.0"}}, "name": "fake"})()
    reports = four_ranks(tmp_path, b_mounts=("/data", "/dev/shm"))
    assert all(r["exit_code"] == 0 for r in reports), [c for r in reports for c in r["checks"] if c["status"] == "fail"]
    doctor_cluster(monkeypatch, reports)
    checks.test_doctor_cluster_allreduce_through_torch(target, None)
    doctor_cluster(monkeypatch, reports, allreduce_ok=False)
    with pytest.raises(
        AssertionError,
        match=r"the gloo all-reduce of 4 ranks: \{'backend': 'gloo', 'ranks': 4, .*"
        r"'ok': False, 'error': 'rank 0: wrong values; rank 1: wrong values",
    ):
        checks.test_doctor_cluster_allreduce_through_torch(target, None)


def with_defect(monkeypatch, defect):
    """The fake start_cluster of doctor_cluster, each launch's result passed through
    ``defect(cmd, result)`` first: what a broken doctor or launcher would have printed instead."""
    real = checks.start_cluster

    @contextmanager
    def start_cluster(target, caps, extra=None):
        with real(target, caps, extra) as c:
            yield SimpleNamespace(
                hosts=c.hosts, launch=lambda per_host, cmd, timeout=180: defect(cmd, c.launch(per_host, cmd, timeout))
            )

    monkeypatch.setattr(checks, "start_cluster", start_cluster)


def in_json(change):
    """A defect on the JSON run only: ``change(report)`` edits its document."""

    def defect(cmd, r):
        if "--json" not in cmd:
            return r
        report = json.loads(r.stdout)
        change(report)
        return SimpleNamespace(returncode=r.returncode, stdout=json.dumps(report), stderr=r.stderr)

    return defect


def in_text(edit, rc=None):
    """A defect on the table run only: ``edit(stdout)``, and its exit code ``rc`` where given."""

    def defect(cmd, r):
        if "--json" in cmd:
            return r
        return SimpleNamespace(returncode=r.returncode if rc is None else rc, stdout=edit(r.stdout), stderr=r.stderr)

    return defect


@pytest.mark.parametrize(
    "defect, message",
    [
        # a launcher that passes on 0 whatever its ranks exit with
        (in_text(lambda out: out, rc=0), r"the job exited 0 though b lacks the /data a has"),
        # every rank prints the table, not rank 0 alone
        (in_text(lambda out: out * 4), r"the table must be printed once \(rank 0\)"),
        # the ranks placed round-robin, not by node (what the table says of them)
        (in_text(lambda out: out.replace("a     0-1", "a     0,2").replace("b     2-3", "b     1,3")), r"a\s+0,2"),
        # --allreduce mpi ignored: no collective run or checked
        (
            in_text(lambda out: "".join(ln for ln in out.splitlines(True) if not ln.startswith("all-reduce"))),
            r"no checked MPI all-reduce of 4 ranks",
        ),
        (
            lambda cmd, r: SimpleNamespace(
                returncode=r.returncode, stdout=r.stdout * 2 if "--json" in cmd else r.stdout, stderr=r.stderr
            ),
            r"one JSON document \(rank 0\)",
        ),
        # the JSON document's exit code not raised for the difference
        (in_json(lambda rep: rep.update(exit_code=0)), r"exit_code"),
        # the difference blamed on the node that has the mount
        (in_json(lambda rep: rep["differences"][0].update(nodes=["a"])), r"\[\['a'\]\]"),
    ],
    ids=[
        "exit-0",
        "table-on-every-rank",
        "ranks-round-robin",
        "no-all-reduce",
        "json-on-every-rank",
        "json-exit-code-0",
        "difference-on-a",
    ],
)
def test_the_suite_s_mount_check_fails_on_each_defect(tmp_path, monkeypatch, defect, message):
    doctor_cluster(monkeypatch, four_ranks(tmp_path))
    with_defect(monkeypatch, defect)
    with pytest.raises(AssertionError, match=message):
        checks.test_doctor_cluster_names_the_node_without_the_mount(None, None)


@pytest.mark.parametrize(
    "defect, message",
    [
        # every rank prints the JSON document
        (lambda cmd, r: SimpleNamespace(returncode=r.returncode, stdout=r.stdout * 2, stderr=r.stderr), r"^exit 0: "),
        # the all-reduce checked correct, but the job exits 1 (a rank died at teardown)
        (lambda cmd, r: SimpleNamespace(returncode=1, stdout=r.stdout, stderr=r.stderr), r"exit 1 \(report: 0\)"),
        # correct values, no bandwidth measured
        (in_json(lambda rep: rep["allreduce"].update(busbw_GBps=0.0)), r"busbw 0\.0 GB/s"),
    ],
    ids=["json-on-every-rank", "exit-1", "no-bandwidth"],
)
def test_the_suite_s_torch_allreduce_check_fails_on_each_defect(tmp_path, monkeypatch, defect, message):
    only = [core.CHECKS["image.manifest"], core.CHECKS["launch.contract"]]
    monkeypatch.setattr(core, "CHECKS", {c.id: c for c in only})
    target = type("T", (), {"manifest": {"frameworks": {"pytorch": "2.10.0"}}, "name": "fake"})()
    doctor_cluster(monkeypatch, four_ranks(tmp_path, b_mounts=("/data", "/dev/shm")))
    with_defect(monkeypatch, defect)
    with pytest.raises(AssertionError, match=message):
        checks.test_doctor_cluster_allreduce_through_torch(target, None)
