"""The multinode heap-check run judged on a fake cluster, so its failure is shown without two
containers: a library destructor that frees a pointer twice aborts every rank at exit under
glibc's checker (after the all-reduce printed its result), and the check must fail with the
launcher's exit and the abort; a clean exit passes."""

import json
from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_multinode


def _cluster(rc: int, stderr: str):
    ranks = "".join(
        f"TBCONF {json.dumps({'rank': r, 'size': 4, 'ok': True, 'host': 'ab'[r // 2]})}\n" for r in range(4)
    )
    commands = []

    def launch(per_host, cmd, timeout=180):
        commands.append(cmd)
        return SimpleNamespace(returncode=rc, stdout=ranks, stderr=stderr)

    return SimpleNamespace(hosts=["a", "b"], python="/opt/trainbase/venv/bin/python", launch=launch, commands=commands)


def test_a_double_free_at_exit_fails_the_heap_checked_run():
    abort = (
        "free(): double free detected in tcache 2\n[b:00042] *** Process received signal ***\n"
        "mpirun noticed that process rank 2 with PID 42 on node b exited on signal 6 (Aborted)."
    )
    cluster = _cluster(134, abort)
    with pytest.raises(
        AssertionError,
        match=r"mpi4py allreduce under MALLOC_CHECK_=3 across \['a', 'b'\] exited 134: "
        r".*double free detected",
    ):
        test_multinode.test_multinode_mpi_exits_cleanly_under_heap_checks(None, cluster)
    assert "LD_PRELOAD=libc_malloc_debug.so.0 MALLOC_CHECK_=3" in cluster.commands[0], cluster.commands


def test_a_clean_exit_passes():
    test_multinode.test_multinode_mpi_exits_cleanly_under_heap_checks(None, _cluster(0, ""))
