"""The collectives probe (probes/collectives.py), the floors (floors.py) and the checks that run
them (checks/test_collectives.py), without a GPU.

The probe's formulas are checked against a plain-Python reference of each collective; its merge
and the floors are judged on documents in its own format. Where a Python with torch is at hand
(this venv, or TB_TORCH_PYTHON=PATH), the probe runs for real over gloo on the CPU, 2 and 3
ranks, and the checks' own code runs it: a collective that returns a wrong element must fail
them, naming the collective, size, rank and element. Without torch those cases skip, saying so."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainbase_conformance import floors
from trainbase_conformance.checks import test_collectives as checks
from trainbase_conformance.expectations import ExpectationsError
from trainbase_conformance.resources import PROBES

probe = floors.load_probe()
N = 4


def torch_python() -> str | None:
    """A Python that has torch: TB_TORCH_PYTHON, else this one if it imports torch."""
    want = os.environ.get("TB_TORCH_PYTHON")
    for py in ([want] if want else []) + [sys.executable]:
        r = subprocess.run(
            [py, "-c", "import torch.distributed as d; assert d.is_gloo_available()"], capture_output=True, check=False
        )
        if r.returncode == 0:
            return py
    return None


TORCH_PY = torch_python()
needs_torch = pytest.mark.skipif(
    TORCH_PY is None,
    reason="no Python with torch here (set TB_TORCH_PYTHON=PATH): "
    "the probe's real gloo run is not exercised, its formulas and verdicts are",
)


# --------------------------------------------------------------------------- the formulas


def test_bus_factors_are_nccl_tests_formulas():
    want = {
        "all_reduce": 2 * 7 / 8,
        "all_gather": 7 / 8,
        "reduce_scatter": 7 / 8,
        "all_to_all": 7 / 8,
        "broadcast": 1.0,
        "sendrecv": 1.0,
    }
    assert {c: probe.bus_factor(c, 8) for c in probe.COLLECTIVES} == want
    assert probe.bus_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        probe.bus_factor("reduce", 2)


def test_sizes_double_from_8_bytes_to_256_mib_and_tiny_ones_are_not_repeated():
    s = probe.sizes(8, 256 << 20)
    assert s[0] == 8 and s[-1] == 256 << 20 and len(s) == 26
    # 3 ranks: 8 B and 16 B of all-gather both round to one int32 per rank (12 B moved): measured once
    assert probe.plan("all_gather", 8, 64, 3)[:2] == [8, 32]
    assert probe.moved_bytes("all_gather", 16, 3) == 12


def reference(coll, n, nbytes):
    """What each rank holds after ``coll``, computed by hand from every rank's fill."""
    send, recv = probe.counts(coll, nbytes, n)
    src = [[probe.fill(r, i) for i in range(send)] for r in range(n)]
    if coll == "all_reduce":
        return [[sum(src[q][i] for q in range(n)) for i in range(send)] for _ in range(n)]
    if coll == "all_gather":
        return [[x for q in range(n) for x in src[q]] for _ in range(n)]
    if coll == "reduce_scatter":
        return [[sum(src[q][r * recv + i] for q in range(n)) for i in range(recv)] for r in range(n)]
    if coll == "all_to_all":
        c = send // n
        return [[x for q in range(n) for x in src[q][r * c : (r + 1) * c]] for r in range(n)]
    raise ValueError(coll)


def want(coll, n, nbytes, rank):
    send, recv = probe.counts(coll, nbytes, n)
    chunk = recv if coll == "reduce_scatter" else (send if coll == "all_gather" else send // n)
    return [probe.expected(coll, rank, n, i, chunk=chunk) for i in range(recv)]


@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_expected_values_are_what_each_collective_computes(coll, n):
    for r, got in enumerate(reference(coll, n, 4096)):
        assert probe.first_mismatch(got, want(coll, n, 4096, r)) is None


def test_a_chunk_from_the_wrong_peer_is_caught_at_its_first_element():
    got = reference("all_gather", N, 4096)[0]
    c = len(got) // N
    got[c : 2 * c], got[2 * c : 3 * c] = got[2 * c : 3 * c], got[c : 2 * c]  # ranks 1 and 2 swapped
    m = probe.first_mismatch(got, want("all_gather", N, 4096, 0))
    assert m == {"index": c, "got": probe.fill(2, 0), "want": probe.fill(1, 0), "wrong": 2 * c}


def test_an_all_to_all_that_sends_the_wrong_offset_is_caught():
    got = reference("all_to_all", N, 4096)[1]
    c = len(got) // N
    got[0:c] = [probe.fill(0, i) for i in range(c)]  # rank 0's chunk 0, not its chunk 1
    m = probe.first_mismatch(got, want("all_to_all", N, 4096, 1))
    assert m is not None and m["index"] == 0 and m["wrong"] == c


def test_broadcast_and_sendrecv_want_the_roots_and_the_senders_data():
    assert probe.expected("broadcast", 3, N, 5, peer=1) == probe.fill(1, 5)
    assert probe.expected("sendrecv", 0, N, 5, peer=3) != probe.expected("sendrecv", 0, N, 5, peer=2)


# --------------------------------------------------------------------------- merge and the verdicts


def rank_doc(rank, n=2, mismatch=None, time_s=1e-3, nbytes=1 << 20):
    row = {"bytes": nbytes, "time_s": time_s, "mismatch": mismatch}
    colls = {c: {"api": c, "rows": [dict(row)]} for c in probe.COLLECTIVES}
    return {
        "rank": rank,
        "world": n,
        "backend": "nccl",
        "device": f"cuda:{rank}",
        "torch": "2.9.1",
        "collectives": colls,
    }


def test_merge_takes_the_slowest_rank_and_the_lowest_failing_rank():
    bad = {"index": 7, "got": 1, "want": 2, "wrong": 3}
    doc = probe.merge([rank_doc(1, time_s=2e-3, mismatch=bad), rank_doc(0)])
    ar = doc["collectives"]["all_reduce"]["rows"][0]
    assert ar["time_us"] == 2000.0 and ar["algbw_GBps"] == pytest.approx((1 << 20) / 2e-3 / 1e9, rel=1e-3)
    assert ar["busbw_GBps"] == pytest.approx(ar["algbw_GBps"] * 1.0, rel=1e-3)  # 2 ranks: 2(n-1)/n = 1
    assert not ar["ok"] and ar["first_mismatch"] == dict(bad, rank=1) and not doc["ok"]
    assert "element 7 = 1, want 2" in probe.table(doc)


def test_a_rank_that_never_reported_makes_the_document_fail():
    doc = probe.merge([rank_doc(0, n=3), rank_doc(2, n=3)])
    assert not doc["ok"] and doc["errors"] == ["ranks that reported: [0, 2], want 0..2"]
    assert floors.value_problems(doc, 3, True) == doc["errors"]


def test_value_problems_name_the_collective_size_rank_and_element():
    doc = probe.merge(
        [rank_doc(0), rank_doc(1, mismatch={"index": 9, "got": 5, "want": 6, "wrong": 1, "pair": "0->1"})]
    )
    problems = floors.value_problems(doc, world=2, every_collective=True)
    assert "all_gather at 1 MiB: rank 1 element 9 is 5, want 6 (1 wrong, pair 0->1)" in problems
    assert floors.value_problems(probe.merge([rank_doc(0), rank_doc(1)]), world=2, every_collective=True) == []
    assert floors.value_problems(probe.merge([rank_doc(0), rank_doc(1)]), world=8, every_collective=True) == [
        "the probe ran 2 rank(s), want 8"
    ]


def test_an_unsupported_collective_fails_on_nccl_and_is_reported_on_gloo():
    docs = [rank_doc(0), rank_doc(1)]
    for d in docs:
        d["collectives"]["reduce_scatter"] = {"unsupported": "unsupported by backend gloo (reduce_scatter): ..."}
    doc = probe.merge(docs)
    assert doc["ok"] and "unsupported by backend gloo" in probe.table(doc)
    assert floors.value_problems(doc, 2, every_collective=False) == []
    assert floors.value_problems(doc, 2, every_collective=True) == [
        "reduce_scatter: unsupported by backend gloo (reduce_scatter): ..."
    ]


def measured(busbw_at_256m):
    """A merged 8-GPU document: all-reduce at 128 and 256 MiB."""
    rows = [
        {"bytes": b, "time_us": 1.0, "algbw_GBps": 1.0, "busbw_GBps": bw, "ok": True, "first_mismatch": None}
        for b, bw in ((128 << 20, 300.0), (256 << 20, busbw_at_256m))
    ]
    return {
        "world": 8,
        "errors": [],
        "collectives": {
            "all_reduce": {"api": "all_reduce", "rows": rows},
            "all_to_all": {"unsupported": "unsupported by backend x"},
        },
    }


def test_a_floor_missed_names_the_collective_size_measured_and_floor():
    floor = [floors.Floor("all_reduce", 256 << 20, 360.0)]
    assert floors.floor_misses(measured(371.2), floor, "nvswitch") == []
    assert floors.floor_misses(measured(71.9), floor, "nvswitch") == [
        "all_reduce at 256 MiB: busbw 71.9 GB/s is below the runner's floor 360 GB/s (nvswitch)"
    ]


def test_a_floor_at_a_size_not_measured_or_on_a_missing_collective_is_a_miss():
    at_1g = floors.floor_misses(measured(400.0), [floors.Floor("all_reduce", 1 << 30, 10.0)])
    assert at_1g == [
        "all_reduce at 1 GiB: not measured (sizes measured: 128 MiB, 256 MiB), the runner's floor is 10 GB/s"
    ]
    a2a = floors.floor_misses(measured(400.0), [floors.Floor("all_to_all", 1 << 20, 10.0)])
    assert a2a == [
        "all_to_all at 1 MiB: not measured (unsupported: unsupported by backend x), the runner's floor is 10 GB/s"
    ]
    # a size between two measured ones is judged at the largest measured size below it
    between = floors.floor_misses(measured(400.0), [floors.Floor("all_reduce", 200 << 20, 350.0)])
    assert between == [
        "all_reduce at 200 MiB: busbw 300 GB/s is below the runner's floor 350 GB/s (measured at 128 MiB)"
    ]


RUNNER = """
name: dgx-h100
fabric: {intra_node: nvswitch, inter_node: infiniband-ndr}
floors:
  intra_node:
    - {collective: all_reduce, bytes: 268435456, busbw_GBps: 360}
"""


def test_the_runner_file_loads_and_a_wrong_one_names_the_field(tmp_path):
    good = tmp_path / "runner.yaml"
    good.write_text(RUNNER)
    r = floors.load_runner(good)
    assert r.fabric["intra_node"] == "nvswitch" and r.floors["intra_node"] == [
        floors.Floor("all_reduce", 1 << 28, 360.0)
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text(RUNNER.replace("nvswitch", "nvlink5").replace("busbw_GBps: 360", "busbw: 360"))
    with pytest.raises(ExpectationsError) as e:
        floors.load_runner(bad)
    assert "fabric.intra_node: 'nvlink5' is not one of" in str(e.value)
    assert "floors.intra_node.0: 'busbw_GBps' is a required property" in str(e.value)


# --------------------------------------------------------------------------- the checks on fakes


class FakeTarget:
    """An image with PyTorch on a host of ``gpus`` GPUs; ``sh`` answers with ``doc`` or, given
    ``real``, runs the command here with that Python (the probe over gloo: no GPU here)."""

    def __init__(self, gpus=2, doc=None, real=None, frameworks=None):
        self.caps = SimpleNamespace(gpu=gpus > 0, gpu_count=gpus)
        self.manifest = {"frameworks": {"pytorch": "2.9.1"} if frameworks is None else frameworks}
        self.name = "img"
        self.python = "/opt/venv/bin/python"
        self.cache = {}
        self.doc, self.real, self.commands = doc, real, []

    def sh(self, cmd, timeout=None):
        self.commands.append(cmd)
        if self.real is None:
            return SimpleNamespace(rc=0 if self.doc["ok"] else 1, stdout=json.dumps(self.doc) + "\n", stderr="")
        return run_here(cmd.replace("--backend nccl", "--backend gloo") + " --max-bytes 4096 --iters 1", self.real)


def run_here(cmd, python, extra=""):
    cmd = cmd.replace("/opt/venv/bin/python", python).replace(checks.PROBE_DIR, str(PROBES))
    p = subprocess.run(shlex.split(cmd + extra), capture_output=True, text=True, timeout=300, check=False)
    return SimpleNamespace(rc=p.returncode, returncode=p.returncode, stdout=p.stdout, stderr=p.stderr)


def gpu_doc(n=2, mismatch=None):
    return probe.merge([rank_doc(r, n=n, mismatch=mismatch if r == n - 1 else None) for r in range(n)])


def test_the_gpu_check_passes_on_right_values_and_fails_on_a_wrong_element():
    t = FakeTarget(2, gpu_doc())
    checks.test_collectives_value_checked_on_every_local_gpu(t)
    assert "--backend nccl --ranks 2 --max-bytes 268435456" in t.commands[0]
    with pytest.raises(AssertionError, match=r"broadcast at 1 MiB: rank 1 element 4 is 9, want 8 \(2 wrong, root 1\)"):
        checks.test_collectives_value_checked_on_every_local_gpu(
            FakeTarget(2, gpu_doc(mismatch={"index": 4, "got": 9, "want": 8, "wrong": 2, "root": 1}))
        )


def test_the_gpu_check_fails_when_fewer_ranks_ran_than_the_host_has_gpus():
    with pytest.raises(AssertionError, match=r"the probe ran 2 rank\(s\), want 8"):
        checks.test_collectives_value_checked_on_every_local_gpu(FakeTarget(8, gpu_doc()))


def test_a_probe_that_printed_nothing_fails_both_gpu_checks_with_its_stderr(monkeypatch, tmp_path):
    f = tmp_path / "runner.yaml"
    f.write_text(RUNNER)
    monkeypatch.setenv(floors.RUNNER_ENV, str(f))
    crashed = SimpleNamespace(rc=1, stdout="", stderr="OSError: libnccl.so.2: cannot open shared object file")
    for check in (
        checks.test_collectives_value_checked_on_every_local_gpu,
        checks.test_collectives_busbw_meets_the_runners_floors_on_local_gpus,
    ):
        t = FakeTarget(2, gpu_doc())
        t.sh = lambda cmd, timeout=None: crashed
        with pytest.raises(AssertionError, match=r"exited 1 and printed nothing: OSError: libnccl.so.2: cannot open"):
            check(t)


def test_an_image_without_pytorch_is_skipped_naming_the_ctypes_check():
    with pytest.raises(pytest.skip.Exception, match="test_nccl_allreduce_gpu"):
        checks.test_collectives_value_checked_on_every_local_gpu(FakeTarget(2, gpu_doc(), frameworks={}))


def test_without_a_declared_floor_the_bandwidth_check_skips_saying_nothing_passed(monkeypatch):
    monkeypatch.delenv(floors.RUNNER_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="the runner declares none .*nothing passed on bandwidth"):
        checks.test_collectives_busbw_meets_the_runners_floors_on_local_gpus(FakeTarget(2, gpu_doc()))


def test_the_bandwidth_check_fails_below_the_runners_floor(monkeypatch, tmp_path):
    f = tmp_path / "runner.yaml"
    f.write_text(RUNNER.replace("268435456", str(1 << 20)).replace("360", "2000"))
    monkeypatch.setenv(floors.RUNNER_ENV, str(f))
    # rank_doc: 1 MiB in 1 ms on 2 ranks: algbw 1.049 GB/s, all-reduce busbw x 2(n-1)/n = 1
    with pytest.raises(
        AssertionError,
        match=r"all_reduce at 1 MiB: busbw 1.049 GB/s is below the runner's floor "
        r"2000 GB/s \(nvswitch\)",
    ):
        checks.test_collectives_busbw_meets_the_runners_floors_on_local_gpus(FakeTarget(2, gpu_doc()))
    f.write_text(RUNNER.replace("268435456", str(1 << 20)).replace("360", "1"))
    checks.test_collectives_busbw_meets_the_runners_floors_on_local_gpus(FakeTarget(2, gpu_doc()))
    # scope not declared: skipped, naming the file and the scope
    with pytest.raises(pytest.skip.Exception, match=r"runner.yaml declares no floors.inter_node"):
        checks._runner("inter_node")


# --------------------------------------------------------------------------- the probe for real (gloo, CPU)


def real_probe(ranks, *args):
    cmd = [
        TORCH_PY,
        str(PROBES / "collectives.py"),
        "--backend",
        "gloo",
        "--ranks",
        str(ranks),
        "--max-bytes",
        "4096",
        "--iters",
        "1",
        *args,
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    return p.returncode, json.loads(p.stdout.strip().splitlines()[-1])


@needs_torch
@pytest.mark.parametrize("ranks", [3])
def test_the_probe_runs_every_collective_over_gloo_and_every_value_is_right(ranks):
    rc, doc = real_probe(ranks)
    assert rc == 0 and doc["ok"] and doc["world"] == ranks and doc["backend"] == "gloo", doc
    for coll in probe.COLLECTIVES:
        c = doc["collectives"][coll]
        assert "unsupported" in c or (c["rows"] and all(r["ok"] for r in c["rows"])), (coll, c)
    assert floors.value_problems(doc, ranks, every_collective=False) == []


@needs_torch
def test_a_collective_returning_a_wrong_element_fails_the_real_probe():
    rc, doc = real_probe(3, "--inject-wrong", "all_to_all,sendrecv", "--collectives", "all_to_all,sendrecv")
    assert rc == 1 and not doc["ok"]
    problems = floors.value_problems(doc, 3, every_collective=False)
    assert {p.split(" at ")[0] for p in problems} == {"all_to_all", "sendrecv"}
    assert all("rank 2 element" in p for p in problems), problems
    assert "sendrecv at 8 B: rank 2 element 1 is 1027, want 1026 (1 wrong, pair 1->2)" in problems


@needs_torch
def test_the_gpu_check_fails_on_a_real_run_with_a_wrong_all_gather(monkeypatch):
    t = FakeTarget(2, real=TORCH_PY)
    checks.test_collectives_value_checked_on_every_local_gpu(t)  # the honest run passes
    t = FakeTarget(2, real=TORCH_PY)
    orig = t.sh
    t.sh = lambda cmd, timeout=None: orig(cmd + " --inject-wrong all_gather")
    with pytest.raises(AssertionError, match=r"all_gather at 8 B: rank 1 element \d+ is \d+, want \d+ \(1 wrong\)"):
        checks.test_collectives_value_checked_on_every_local_gpu(t)


class CannedNode:
    """A container whose probe prints these ranks' TBCOLL lines (one node of the cluster)."""

    def __init__(self, docs):
        self.docs = docs

    def exec(self, cmd, timeout=None):
        out = "".join("TBCOLL " + json.dumps(d) + "\n" for d in self.docs)
        return SimpleNamespace(returncode=0, stdout=out, stderr="")


def canned_cluster(mismatch=None):
    docs = [rank_doc(r, n=4, mismatch=mismatch if r == 3 else None) for r in range(4)]
    return SimpleNamespace(
        nodes=[CannedNode(docs[:2]), CannedNode(docs[2:])], hosts=["a", "b"], python="/opt/venv/bin/python"
    )


def test_the_across_containers_check_fails_on_a_wrong_element_of_the_second_node():
    checks.test_collectives_value_checked_across_containers(FakeTarget(0), canned_cluster())
    with pytest.raises(
        AssertionError,
        match=r"(?s)collectives across \['a', 'b'\]:.*all_reduce at 1 MiB: "
        r"rank 3 element 11 is 0, want 4 \(1 wrong\)",
    ):
        checks.test_collectives_value_checked_across_containers(
            FakeTarget(0), canned_cluster({"index": 11, "got": 0, "want": 4, "wrong": 1})
        )


def test_the_across_containers_floor_fails_below_the_runners_inter_node_floor(monkeypatch, tmp_path):
    f = tmp_path / "runner.yaml"
    f.write_text(
        "fabric: {inter_node: sockets}\nfloors:\n  inter_node:\n"
        "    - {collective: broadcast, bytes: 1048576, busbw_GBps: 5}\n"
    )
    monkeypatch.setenv(floors.RUNNER_ENV, str(f))
    with pytest.raises(
        AssertionError,
        match=r"broadcast at 1 MiB: busbw 1.049 GB/s is below the runner's floor "
        r"5 GB/s \(sockets\)",
    ):
        checks.test_collectives_busbw_meets_the_runners_floors_across_containers(FakeTarget(0), canned_cluster())
    monkeypatch.delenv(floors.RUNNER_ENV)
    with pytest.raises(pytest.skip.Exception, match="nothing passed on bandwidth"):
        checks.test_collectives_busbw_meets_the_runners_floors_across_containers(FakeTarget(0), canned_cluster())


class FakeNode:
    def __init__(self, python, extra):
        self.python, self.extra = python, extra

    def exec(self, cmd, timeout=None):
        return run_here(cmd.replace("--master a ", "--master 127.0.0.1 "), self.python, self.extra)


@needs_torch
@pytest.mark.parametrize("wrong", ["", "reduce_scatter"])
def test_the_across_containers_check_merges_both_nodes_ranks(wrong):
    """Two "nodes" here, 2 ranks each, meeting over gloo/TCP as the containers do (master a: here
    127.0.0.1); a wrong reduce-scatter element on the last rank must fail the check."""
    extra = (
        " --max-bytes 4096 --iters 1 --port " + str(29600 + len(wrong)) + (f" --inject-wrong {wrong}" if wrong else "")
    )
    cluster = SimpleNamespace(
        nodes=[FakeNode(TORCH_PY, extra), FakeNode(TORCH_PY, extra)], hosts=["a", "b"], python="/opt/venv/bin/python"
    )
    target = FakeTarget(0)
    if not wrong:
        checks.test_collectives_value_checked_across_containers(target, cluster)
        assert target.cache["collectives.across"]["world"] == 4
        return
    with pytest.raises(AssertionError, match=r"reduce_scatter at \d+ \w+: rank 3 element 0 is \d+, want \d+"):
        checks.test_collectives_value_checked_across_containers(target, cluster)


def test_the_recorded_gloo_table_in_the_docs_comes_from_this_probe():
    """docs/gpu-tier.md carries a table the probe printed (table()'s header)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "gpu-tier.md").read_text()
    assert probe.table({"collectives": {}}).splitlines()[0] in doc
