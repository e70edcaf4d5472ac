"""The helpers the checks delegate their verdict to, each assert of them made to fail on the lines
the probes and examples really print: the runtime tier's world (probes/runtime_world.py's TBWORLD
lines), Azure ML's finished ranks and exit codes, the two-node MPI jobs' TBCONF lines, the 4-rank
MPI jobs' ranks, the examples' OK lines and Lightning's one world. The mutation run
(tests/conformance/mutation.py) runs these against every mutant of those helpers' asserts, for
every check that calls them."""

import json
from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_azureml as aml
from trainbase_conformance.checks import test_frameworks, test_lightning, test_mpi, test_multinode, test_runtime

# --------------------------------------------------------------------------- the runtime tier's world


def world_line(rank, n=2, allreduce_ok=True, launch=None, torch=None):
    line = {
        "rank": rank,
        "size": n,
        "allreduce": n * (n - 1) // 2 if allreduce_ok else 0,
        "allreduce_ok": allreduce_ok,
        "launch": launch or {"launcher": "mpi", "rank": rank, "world_size": n, "local_rank": rank},
    }
    if torch is not None:
        line["torch_allreduce"] = torch
    return "TBWORLD " + json.dumps(line)


def world(*lines):
    return "".join(ln + "\n" for ln in lines)


@pytest.mark.parametrize(
    "out, rc, torch, why",
    [
        (world(), 127, False, r"ch-run: exit 127: sh: 1: mpirun: not found"),
        (
            world(world_line(0, n=1), world_line(0, n=1)),
            0,
            False,
            r"MPI ranks \[\(0, 1\), \(0, 1\)\], want 0\.\.1 of 2",
        ),
        (world(world_line(0), world_line(1, allreduce_ok=False)), 0, False, r"rank 1: Allreduce gave 0"),
        (
            world(world_line(0), world_line(1, launch={"error": "no rank variable"})),
            0,
            False,
            r"rank 1: tb-launch refused: no rank variable",
        ),
        (
            world(world_line(0), world_line(1, launch={"launcher": "single", "rank": 0, "world_size": 1})),
            0,
            False,
            r"rank 1: the launch contract says \{'launcher': 'single', 'rank': 0, 'world_size': 1\}, MPI says rank 1 of 2",
        ),
        (world(world_line(0, torch=3.0), world_line(1, torch=1.0)), 0, True, r"rank 1: gloo all-reduce"),
    ],
)
def test_the_runtime_world_fails_on_each_way_a_job_goes_wrong(out, rc, torch, why):
    ok = world(world_line(0, torch=3.0), world_line(1, torch=3.0))
    assert [r["rank"] for r in test_runtime.check_world(ok, "", 0, "ch-run", torch=True)] == [0, 1]
    with pytest.raises(AssertionError, match=why):
        test_runtime.check_world(out, "sh: 1: mpirun: not found" if rc else "", rc, "ch-run", torch=torch)


# --------------------------------------------------------------------------- Azure ML's processes


def proc(rank, node):
    return SimpleNamespace(node=node, env={"RANK": str(rank)})


def res(rc=0, out="", err=""):
    return SimpleNamespace(returncode=rc, stdout=out, stderr=err)


def test_outputs_names_the_process_that_exited_non_zero():
    assert aml.outputs([(proc(0, 0), res(0, "a\n")), (proc(1, 0), res(0, "b\n"))], "x") == "a\nb\n"
    with pytest.raises(AssertionError, match=r"type: pytorch: node 1 rank 3: exit 1: DistStoreError"):
        aml.outputs([(proc(0, 0), res(0, "a\n")), (proc(3, 1), res(1, "", "DistStoreError"))], "type: pytorch")


JOB = SimpleNamespace(cluster=SimpleNamespace(hosts=["a", "b"]))


def ok(rank, world=4, host=None, node_rank=None):
    tail = f" host={host} node_rank={node_rank}" if host else ""
    return f"OK rank={rank} world={world}{tail}\n"


@pytest.mark.parametrize(
    "stdout, why",
    [
        (
            "".join(ok(r % 2, world=2) for r in range(4)),
            r"what: ranks that finished: \['0', '0', '1', '1'\], want 0\.\.3",
        ),
        ("".join(ok(r, world=2) for r in range(4)), r"what: world size: \{'rank': '0', 'world': '2'\}"),
        ("".join(ok(r, host="ab"[r // 2], node_rank=0) for r in range(4)), r"what: NODE_RANK vs host: .*'rank': '2'"),
    ],
)
def test_check_ok_fails_on_a_missing_rank_a_wrong_world_or_node(stdout, why):
    assert len(aml.check_ok(JOB, "".join(ok(r, host="ab"[r // 2], node_rank=r // 2) for r in range(4)), "what")) == 4
    with pytest.raises(AssertionError, match=why):
        aml.check_ok(JOB, stdout, "what")


FIX = "use tb-launch (or call trainbase_launch.apply()) under another MPI"


@pytest.mark.parametrize(
    "results, why",
    [
        ([(None, res(0, "OK rank=0 world=1\n"))], "exited 0 without Open MPI's variables"),
        ([(None, res(1, "", "Traceback (most recent call last):\nKeyError: 'OMPI_COMM_WORLD_RANK'"))], "KeyError"),
        ([(None, res(1, "", "OMPI_COMM_WORLD_RANK is not set"))], "no fix named"),
        # the fix printed, then the helper crashed on the variable it had just said was missing
        (
            [(None, res(1, FIX + "\n", "Traceback (most recent call last):\nKeyError: 'OMPI_COMM_WORLD_RANK'"))],
            r"what: use tb-launch .*\n\s*Traceback",
        ),
    ],
)
def test_the_guides_helper_must_stop_naming_the_fix(results, why):
    aml.helper_refuses_with_the_fix(JOB, [(None, res(1, "", FIX))], "what")
    with pytest.raises(AssertionError, match=why):
        aml.helper_refuses_with_the_fix(JOB, results, "what")


# --------------------------------------------------------------------------- two-node and 4-rank MPI jobs


def tbconf(rank, host, n=4, ok=True):
    return "TBCONF " + json.dumps(
        {"probe": "c", "rank": rank, "size": n, "host": host, "sum": 10, "bad": 0, "ok": ok}, separators=(",", ":")
    )


CLUSTER = SimpleNamespace(hosts=["a", "b"])


@pytest.mark.parametrize(
    "r, why",
    [
        (
            res(1, "", "ORTE was unable to reliably start one or more daemons"),
            r"mpicc across \['a', 'b'\] exited 1: ORTE",
        ),
        (res(0, world(tbconf(0, "a"), tbconf(1, "a"), tbconf(2, "b"))), r"mpicc: ranks seen"),
        (res(0, world(*(tbconf(r, "ab"[r // 2], ok=r != 3) for r in range(4)))), r"mpicc: wrong size or values"),
        (res(0, world(*(tbconf(r, "a") for r in range(4)))), r"mpicc: ranks per host \{'a': 4, 'b': 0\}"),
    ],
)
def test_a_two_node_job_fails_on_a_lost_rank_wrong_values_or_one_node(r, why):
    test_multinode._check(CLUSTER, res(0, world(*(tbconf(r, "ab"[r // 2]) for r in range(4)))), "mpicc")
    with pytest.raises(AssertionError, match=why):
        test_multinode._check(CLUSTER, r, "mpicc")


def rank(r, n=4, ok=True):
    return {"rank": r, "size": n, "ok": ok}


@pytest.mark.parametrize(
    "ranks, why",
    [
        ([rank(0), rank(1), rank(2)], r"what: ranks seen"),
        ([rank(r, n=8) for r in range(4)], r"what: world sizes \[8, 8, 8, 8\]"),
        ([rank(r, ok=r != 1) for r in range(4)], r"what: wrong values on some rank"),
    ],
)
def test_the_4_rank_verdict_fails_on_a_lost_rank_a_wrong_world_or_wrong_values(ranks, why):
    test_mpi._check_ranks([rank(r) for r in range(4)], 4, "what")
    with pytest.raises(AssertionError, match=why):
        test_mpi._check_ranks(ranks, 4, "what")


# --------------------------------------------------------------------------- the examples' OK lines, Lightning


def test_trained_fails_on_two_worlds_of_two():
    test_frameworks.trained([{"rank": str(r)} for r in range(4)], 4)
    with pytest.raises(AssertionError, match=r"ranks that reported OK: \[0, 0, 1, 1\], want 0\.\.3"):
        test_frameworks.trained([{"rank": str(r % 2)} for r in range(4)], 4)


def lit(rank, world="2", params="5d41402abc4b", env="MPIEnvironment"):
    return {"rank": str(rank), "world": world, "params": params, "env": env}


@pytest.mark.parametrize(
    "ranks, why",
    [
        ([lit(0, world="1"), lit(1, world="1")], r"want one world of 2 with one set of parameters"),
        ([lit(0), lit(1, params="ffffffffffff")], r"want one world of 2 with one set of parameters"),
    ],
)
def test_one_world_fails_on_worlds_or_parameters_that_differ(ranks, why):
    test_lightning.one_world([lit(0), lit(1)], 2)
    with pytest.raises(AssertionError, match=why):
        test_lightning.one_world(ranks, 2)


def test_took_the_world_from_fails_on_another_cluster_environment():
    test_lightning.took_the_world_from([lit(0), lit(1)], "MPIEnvironment", "why")
    with pytest.raises(AssertionError, match=r"why \(MPIEnvironment\): "):
        test_lightning.took_the_world_from([lit(0), lit(1, env="LightningEnvironment")], "MPIEnvironment", "why")
