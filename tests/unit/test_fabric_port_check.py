"""The fabric tier's port check judged on fake `ibv_devinfo` answers, so its failures are shown
without an RDMA device: a container whose verbs stack opens no device (no /dev/infiniband node,
or no provider that loads) and a device whose ports are all down must each fail with what is
wrong; an ACTIVE port passes. The answers are ibv_devinfo's own format (rdma-core 44)."""
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
