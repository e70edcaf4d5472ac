"""Which baked-in settings take the fabric away (trainbase_conformance/transport_settings.py)."""

import pytest

from trainbase_conformance.transport_settings import Setting, defects, parse_config_file, parse_env


def one(name, value, source="image ENV"):
    return defects([Setting(name, value, source)])


@pytest.mark.parametrize(
    "name,value",
    [
        ("NCCL_IB_DISABLE", "1"),
        ("NCCL_NET", "Socket"),
        ("NCCL_P2P_DISABLE", "1"),
        ("NCCL_SHM_DISABLE", "1"),
        ("NCCL_NET_GDR_LEVEL", "LOC"),
        ("NCCL_IB_HCA", "mlx5_0,mlx5_1"),
        ("NCCL_SOCKET_IFNAME", "eth0"),
        ("UCX_TLS", "tcp,sm,self"),
        ("UCX_TLS", "^rc,ud,dc"),
        ("UCX_TLS", "^ib"),
        ("UCX_NET_DEVICES", "mlx5_0:1"),
        ("OMPI_MCA_pml", "ob1"),
        ("OMPI_MCA_pml", "^ucx"),
        ("OMPI_MCA_pml_ucx_tls", "tcp"),
        ("OMPI_MCA_pml_ucx_devices", "mlx5_0"),
        ("FI_PROVIDER", "tcp"),
        ("I_MPI_OFI_PROVIDER", "sockets"),
    ],
)
def test_a_setting_that_takes_the_fabric_away_is_named_with_its_source(name, value):
    found = one(name, value, "/etc/nccl.conf")
    assert len(found) == 1 and found[0].startswith(f"{name}={value} (/etc/nccl.conf): ")


@pytest.mark.parametrize(
    "name,value",
    [
        ("NCCL_IB_DISABLE", "0"),
        ("NCCL_NET", "IB"),
        ("NCCL_SOCKET_IFNAME", "^docker0,lo"),
        ("NCCL_IB_HCA", "^mlx5_bond"),
        ("UCX_TLS", "rc,sm,self"),
        ("UCX_TLS", "dc_x,self"),
        ("UCX_TLS", "all"),
        ("UCX_TLS", "^tcp"),
        ("UCX_TLS", "^rc"),
        ("OMPI_MCA_pml", "ucx"),
        ("OMPI_MCA_pml_ucx_tls", "any"),
        ("OMPI_MCA_pml_ucx_devices", "any"),
        ("OMPI_MCA_btl", "^openib"),
        ("OMPI_MCA_btl_vader_single_copy_mechanism", "none"),
        ("FI_PROVIDER", "mlx"),
        ("FI_PROVIDER", "verbs"),
        ("NCCL_DEBUG", "INFO"),
        ("PATH", "/usr/bin"),
    ],
)
def test_settings_that_keep_the_fabric_are_not_named(name, value):
    assert one(name, value) == []


def test_trainbases_own_environment_passes():
    env = (
        "OMPI_ALLOW_RUN_AS_ROOT=1\nOMPI_MCA_btl_vader_single_copy_mechanism=none\nOMPI_MCA_pml_ucx_tls=any\n"
        "OMPI_MCA_pml_ucx_devices=any\nI_MPI_ROOT=/opt/trainbase/venv\nFI_PROVIDER_PATH=/opt/trainbase/venv/lib"
    )
    assert defects(parse_env(env, "image ENV")) == []


def test_env_dash_zero_and_lines_both_parse():
    assert parse_env("A=1\0B=x=y\0", "s") == [Setting("A", "1", "s"), Setting("B", "x=y", "s")]
    assert parse_env("A=1\nB=2", "s") == [Setting("A", "1", "s"), Setting("B", "2", "s")]


def test_config_files_read_as_their_tools_read_them():
    mca = parse_config_file("/opt/openmpi/etc/openmpi-mca-params.conf", "# comment\npml = ob1  # why not\n\n")
    assert mca == [Setting("OMPI_MCA_pml", "ob1", "/opt/openmpi/etc/openmpi-mca-params.conf")]
    nccl = parse_config_file("/etc/nccl.conf", "NCCL_IB_DISABLE=1\n#NCCL_NET=Socket\n")
    assert nccl == [Setting("NCCL_IB_DISABLE", "1", "/etc/nccl.conf")]
    # UCX: a [section] holds settings for matching hosts only; the defaults are above it
    ucx = parse_config_file("/etc/ucx/ucx.conf", "UCX_TLS=rc,sm\n[gpu-nodes]\nUCX_TLS=tcp\n")
    assert ucx == [Setting("UCX_TLS", "rc,sm", "/etc/ucx/ucx.conf")]
    assert defects(mca + nccl + ucx) and len(defects(mca + nccl + ucx)) == 2
