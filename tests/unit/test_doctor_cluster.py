"""tb-doctor --cluster on synthetic rank reports: the node x check table, the odd node out,
and both JSON documents against the published schema (docs/doctor.schema.json)."""
import json

import jsonschema
import pytest

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
    reports = [rank_report(tmp_path, "a", 0), rank_report(tmp_path, "a", 1),
               rank_report(tmp_path, "b", 2, mounts=("/dev/shm",)), rank_report(tmp_path, "b", 3, mounts=("/dev/shm",))]
    agg = cluster.aggregate(reports)
    assert [n["hostname"] for n in agg["nodes"]] == ["a", "b"]
    assert [n["ranks"] for n in agg["nodes"]] == [[0, 1], [2, 3]]
    mounts = [d for d in agg["differences"] if d["check"] == "node.mounts"]
    assert mounts == [{"check": "node.mounts", "fact": "mounts", "nodes": ["b"],
                       "summary": "node.mounts: mounts /data missing on b (present on a)"}]
    text = cluster.render(agg, 4, None)
    assert text.count("tb-doctor:") == 1 and "odd one out:" in text
    assert "mounts /data missing on b" in text
    rows = [ln for ln in text.splitlines() if ln.startswith(("a ", "b "))]
    assert len(rows) == 2 and rows[0].split()[1] == "0-1" and rows[1].split()[1] == "2-3"


def test_majority_names_the_odd_driver_and_a_check_failing_on_one_node(tmp_path):
    reports = [rank_report(tmp_path, h, i, driver="575.51.03" if h == "c" else "580.65.06", fail_shm=h == "c")
               for i, h in enumerate("abc")]
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
    coll = {"backend": "mpi", "ranks": 2, "bytes": 8 << 20, "ok": True, "error": "", "seconds": 0.01,
            **cluster._bandwidth(8 << 20, 0.01, 2)}
    jsonschema.validate({**result, "allreduce": coll}, SCHEMA)
    assert coll["busbw_GBps"] == pytest.approx(coll["algbw_GBps"])  # 2 ranks: busbw = algbw * 2(n-1)/n
    assert "values correct" in cluster.describe_collective(coll)


def test_a_singleton_world_under_srun_fails_the_cluster_verdict(tmp_path):
    """srun --mpi=none -n 2 (issue 22): every task is rank 0 of a world of 1 and prints its own
    table; each must fail, saying how many ranks the launch started and why they never met."""
    rep = cluster.with_check(rank_report(tmp_path, "a", 0),
                             cluster.world_check(1, {"SLURM_NTASKS": "2", "SLURM_PROCID": "0"}))
    assert rep["exit_code"] == 1 and rep["summary"]["fail"] >= 1
    jsonschema.validate(rep, SCHEMA)
    agg = cluster.aggregate([rep])
    assert agg["nodes"][0]["status"]["cluster.world"] == "fail"
    text = cluster.render(agg, 1, None)
    assert text.splitlines()[0] == "tb-doctor: 1 node(s), 1 rank(s), expected 2 (SLURM_NTASKS)"
    assert "cluster.world: MPI's world has 1 rank" in text and "--mpi=pmix" in text
    assert "world" in text.splitlines()[1].split()
