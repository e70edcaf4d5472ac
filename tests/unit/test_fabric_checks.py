"""The fabric tier's checks judged on fake answers of the image's tools, so their failures are
shown without an RDMA device: a container whose verbs stack opens no device (no
/dev/infiniband node, or no provider that loads), a device whose ports are all down, and an
ib_write_bw that cannot run or prints no result must each fail with what is wrong; the honest
answers pass. The answers are in the tools' own formats (rdma-core 44, perftest 4.5)."""
from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_ib

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
    with pytest.raises(AssertionError, match=r"the image's ibv_devinfo opened no device \(exit 255\): No IB devices found"):
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
