"""The fabric tier's checks judged on fake answers of the image's tools, so their failures are
shown without an RDMA device: a container whose verbs stack opens no device (no
/dev/infiniband node, or no provider that loads), a device whose ports are all down, and an
ib_write_bw that cannot run or prints no result must each fail with what is wrong; the honest
answers pass. The answers are in the tools' own formats (rdma-core 44, perftest 4.5). And the
multinode allreduce with TCP taken away from the MPI (two fake containers): UCX that finds no
transport between the nodes, and an Intel MPI that cannot open the verbs provider, fail."""

import json
from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_ib, test_multinode

from .framework_fakes import FakeTarget, cluster

ACTIVE = """hca_id:\tmlx5_0
\ttransport:\t\t\tInfiniBand (0)
\tfw_ver:\t\t\t\t28.39.1002
\tnode_guid:\t\t\t0c42:a103:00b2:3c4e
\tvendor_id:\t\t\t0x02c9
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t4096 (5)
\t\t\tlink_layer:\t\tInfiniBand
"""


def _target(rc: int, stdout: str, stderr: str = ""):
    return SimpleNamespace(sh=lambda cmd, timeout=None: SimpleNamespace(rc=rc, stdout=stdout, stderr=stderr))


def test_a_container_whose_verbs_open_no_device_fails():
    """The host's sysfs lists mlx5_0 ACTIVE, but the container has no /dev/infiniband/uverbs0
    (or no provider for it): the image's ibv_devinfo finds nothing, and so would a job."""
    with pytest.raises(
        AssertionError, match=r"the image's ibv_devinfo opened no device \(exit 255\): No IB devices found"
    ):
        test_ib.test_port_active(_target(255, "", "No IB devices found"))


def test_a_device_with_every_port_down_fails():
    down = ACTIVE.replace("PORT_ACTIVE (4)", "PORT_DOWN (1)")
    with pytest.raises(AssertionError, match=r"no ACTIVE port on \['mlx5_0'\]: ports \[\('1', 'PORT_DOWN'\)\]"):
        test_ib.test_port_active(_target(0, down))


def test_an_active_port_passes():
    test_ib.test_port_active(_target(0, ACTIVE))


WRITE_BW = """---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      183340           0.00               11457.61              0.183322
---------------------------------------------------------------------------------------
"""


def test_ib_write_bw_that_cannot_run_or_reports_no_bandwidth_fails():
    """perftest exits non-zero when it cannot open the device or connect; a run that prints no
    result row (a perftest that only parsed its options) moved nothing."""
    with pytest.raises(AssertionError, match=r"ib_write_bw loopback exited 1: Couldn't get context for the device"):
        test_ib.test_ib_write_bw_moves_data(_target(1, "", " Couldn't get context for the device"))
    with pytest.raises(AssertionError, match=r"no bandwidth row"):
        test_ib.test_ib_write_bw_moves_data(_target(0, " RDMA_Write BW Test\n Dual-port : OFF\n"))
    test_ib.test_ib_write_bw_moves_data(_target(0, WRITE_BW))


def allreduce_lines(hosts=("a", "a", "b", "b")) -> str:
    """probes/allreduce_mpi4py.py's lines for 4 ranks, 2 in each container."""
    return "".join(
        "TBCONF " + json.dumps({"rank": r, "size": 4, "host": h, "library": "Open MPI v4.1.4", "ok": True}) + "\n"
        for r, h in enumerate(hosts)
    )


def test_open_mpi_without_tcp_fails_where_ucx_has_no_transport_between_the_nodes():
    def fabric(node, cmd, env):
        assert "--mca pml ucx -x UCX_TLS=^tcp" in cmd, cmd
        return 0, allreduce_lines()

    test_multinode.test_multinode_mpi_crosses_nodes_over_the_fabric(FakeTarget({}), cluster(fabric))
    unreachable = (
        "[a:00213] pml_ucx.c:419 Error: ucp_ep_create(proc=2) failed: Destination is unreachable\n"
        "[a:00213] *** An error occurred in MPI_Allreduce\n"
    )
    with pytest.raises(
        AssertionError,
        match=r"mpi4py allreduce without TCP \(--mca pml ucx -x UCX_TLS=\^tcp\) across "
        r"\['a', 'b'\] exited 1: .*Destination is unreachable",
    ):
        test_multinode.test_multinode_mpi_crosses_nodes_over_the_fabric(
            FakeTarget({}), cluster(lambda node, cmd, env: (1, "", unreachable))
        )


def test_intel_mpi_without_tcp_fails_where_the_verbs_provider_does_not_open():
    provider = "[0] MPI startup(): libfabric provider: verbs;ofi_rxm\n"
    test_multinode.test_multinode_mpi_crosses_nodes_over_the_fabric(
        FakeTarget({}, mpi="intelmpi"), cluster(lambda node, cmd, env: (0, provider + allreduce_lines()), "intelmpi")
    )
    no_verbs = "Abort(1091215) on node 0: Fatal error in PMPI_Init: Other MPI error: OFI addrinfo() failed\n"
    with pytest.raises(
        AssertionError,
        match=r"without TCP \(-genv I_MPI_OFI_PROVIDER verbs -genv I_MPI_DEBUG 1\) .* "
        r"exited 143: Abort\(1091215\) .*OFI addrinfo\(\) failed",
    ):
        test_multinode.test_multinode_mpi_crosses_nodes_over_the_fabric(
            FakeTarget({}, mpi="intelmpi"), cluster(lambda node, cmd, env: (143, "", no_verbs), "intelmpi")
        )
    # a run that names no provider (I_MPI_DEBUG dropped by a wrapper) proves nothing either
    with pytest.raises(AssertionError, match=r"Intel MPI does not name verbs as its libfabric provider"):
        test_multinode.test_multinode_mpi_crosses_nodes_over_the_fabric(
            FakeTarget({}, mpi="intelmpi"), cluster(lambda node, cmd, env: (0, allreduce_lines()), "intelmpi")
        )
