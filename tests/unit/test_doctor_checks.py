"""tb-doctor's checks on fake nodes: each fault the doctor must name, named by the right check
with a fix hint; absent hardware skipped (never ok), or failed under --expect."""

import ctypes

import pytest

from .doctor_fakes import MANIFEST, FakeCuda, FakeNccl, FakeNode, core, doctor, fake_mpi_launchers, result

stack = __import__("trainbase_doctor.checks_stack", fromlist=["x"])
NCCL_PATH = "/opt/trainbase/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"


@pytest.fixture
def node(tmp_path):
    return FakeNode(tmp_path)


def test_every_check_is_registered_once_with_a_title_and_label():
    assert len(doctor.CHECKS) >= 15
    for c in doctor.CHECKS.values():
        assert c.title and c.label and len(c.label) <= 8, c
    with pytest.raises(ValueError, match="unknown check"):
        core.select(["nccl.nope"])
    assert [c.id for c in core.select(["ib"])] == ["ib.devices", "ib.ports", "ib.provider"]


def test_a_check_that_fails_without_a_fix_hint_is_refused(node, monkeypatch):
    bad = core.Check("x.y", "t", "x", lambda n: core.Result("", core.FAIL, "broken"))
    with pytest.raises(RuntimeError, match="without a fix hint"):
        core.run_checks(node, [bad])
    crash = core.Check("x.z", "t", "x", lambda n: 1 / 0)
    r = core.run_checks(node, [crash])[0]
    assert r.status == core.FAIL and "ZeroDivisionError" in r.summary and r.hint


# --- GPUs and driver ------------------------------------------------------------------


@pytest.mark.parametrize("check_id", ["gpu.visible", "gpu.driver", "nccl.network"])
def test_no_gpu_is_skipped_not_ok_and_fails_when_expected(tmp_path, check_id):
    r = result(FakeNode(tmp_path), check_id)
    assert r.status == core.SKIP and "no GPU" in r.summary
    r = result(FakeNode(tmp_path, expect=("gpu",)), check_id)
    assert r.status == core.FAIL and "--gpus all" in r.hint


def test_driver_present_but_no_device_is_no_gpu(tmp_path):
    n = FakeNode(tmp_path, libs={"libcuda.so.1": (FakeCuda(init_rc=100), "/usr/lib/libcuda.so.1")})
    r = result(n, "gpu.visible")
    assert r.status == core.SKIP and "CUDA_ERROR_NO_DEVICE" in r.summary


def test_driver_mismatch_fails_with_its_name(tmp_path):
    n = FakeNode(tmp_path, libs={"libcuda.so.1": (FakeCuda(init_rc=803), "/usr/lib/libcuda.so.1")})
    r = result(n, "gpu.visible")
    assert r.status == core.FAIL and "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH" in r.summary


@pytest.mark.parametrize(
    "driver_cuda, driver, image_cuda, status, words",
    [
        (13000, "580.65.06", "12.8", core.OK, "supports CUDA 13.0"),
        (12080, "570.124.06", "12.8", core.OK, "the image needs 12.8"),
        (12040, "550.54.14", "12.8", core.WARN, "minor-version compatibility"),
        (12040, "550.54.14", "13.0", core.FAIL, "580.65.06"),
        # issue 38: a CUDA major the doctor has no floor for read "needs at least driver a newer one" / "R?"
        (13000, "580.159.04", "14.0", core.FAIL, "knows no minimum driver for CUDA 14"),
    ],
)
def test_driver_against_the_image_cuda(tmp_path, driver_cuda, driver, image_cuda, status, words):
    manifest = {**MANIFEST, "components": {**MANIFEST["components"], "cuda": {"version": image_cuda}}}
    n = FakeNode(
        tmp_path,
        manifest=manifest,
        driver=driver,
        libs={"libcuda.so.1": (FakeCuda(driver_cuda=driver_cuda), "/usr/lib/libcuda.so.1")},
    )
    assert result(n, "gpu.visible").status == core.OK
    r = result(n, "gpu.driver")
    assert r.status == status and words in r.summary, r.summary
    assert r.facts["driver_version"] == driver
    assert "R?" not in (r.hint or "") and "a newer one" not in r.summary and "None" not in r.summary + (r.hint or "")


# --- memory limits --------------------------------------------------------------------


def test_memlock_8mib_is_reported_with_its_fix(tmp_path):
    r = result(FakeNode(tmp_path, memlock=8 << 20), "mem.memlock")
    assert r.status == core.WARN and "8 MiB" in r.summary
    assert "--ulimit memlock=-1" in r.hint and r.hint.startswith("memlock limit is 8 MiB: RDMA needs unlimited")


def test_memlock_limit_with_rdma_devices_fails_unless_ipc_lock(tmp_path):
    n = FakeNode(tmp_path, memlock=8 << 20)
    n.rdma_device("mlx5_0", uverbs=0)
    assert result(n, "mem.memlock").status == core.FAIL
    n = FakeNode(tmp_path, memlock=8 << 20, caps=1 << 14)
    assert result(n, "mem.memlock").status == core.OK
    assert result(FakeNode(tmp_path, memlock=-1), "mem.memlock").status == core.OK


@pytest.mark.parametrize(
    "shm, local, status",
    [
        (64 << 20, "2", core.FAIL),
        (64 << 20, "1", core.WARN),
        (512 << 20, "1", core.WARN),
        (16 << 30, "8", core.OK),
        (None, "1", core.FAIL),
    ],
)
def test_shm_size(tmp_path, shm, local, status):
    r = result(FakeNode(tmp_path, shm=shm, env={"LOCAL_WORLD_SIZE": local}), "mem.shm")
    assert r.status == status, r.summary
    assert status == core.OK or "--shm-size" in r.hint


def test_mounts_ignore_the_ones_every_container_has(node):
    node.write(
        "/proc/self/mountinfo",
        "\n".join(
            f"{i} 1 0:{i} / {p} rw - x x rw"
            for i, p in enumerate(
                [
                    "/",
                    "/proc",
                    "/dev",
                    "/dev/pts",
                    "/dev/shm",
                    "/sys",
                    "/etc/hosts",
                    "/etc/hostname",
                    "/data",
                    "/mnt/my\\040dir",
                ]
            )
        ),
    )
    r = result(node, "node.mounts")
    assert r.facts["mounts"] == ["/data", "/dev/shm", "/mnt/my dir"]


# --- RDMA -----------------------------------------------------------------------------


def test_host_devices_not_in_the_container_fail_with_the_device_flags(node):
    node.rdma_device("mlx5_0", uverbs=None)
    node.rdma_device("mlx5_1", uverbs=None)
    r = result(node, "ib.devices")
    assert r.status == core.FAIL and "mlx5_0, mlx5_1" in r.summary and "--device=/dev/infiniband" in r.hint
    assert result(node, "ib.ports").status == core.SKIP


def test_no_rdma_anywhere_is_skipped_or_failed_when_expected(tmp_path):
    for cid in ("ib.devices", "ib.ports", "ib.provider"):
        assert result(FakeNode(tmp_path), cid).status == core.SKIP
        assert result(FakeNode(tmp_path, expect=("ib",)), cid).status == core.FAIL


def test_ports_down_are_named(node):
    node.rdma_device("mlx5_0", uverbs=0, state="1: DOWN")
    assert result(node, "ib.devices").status == core.OK
    r = result(node, "ib.ports")
    assert r.status == core.FAIL and "mlx5_0/1 DOWN" in r.summary


def test_provider_that_does_not_list_the_device_is_named(node, monkeypatch):
    node.rdma_device("mlx5_0", uverbs=0)
    monkeypatch.setattr("trainbase_doctor.checks_fabric.verbs_devices", lambda n: {})
    r = result(node, "ib.provider")
    assert r.status == core.FAIL and "libmlx5" in r.summary and "mlx5_core" in r.summary
    monkeypatch.setattr("trainbase_doctor.checks_fabric.verbs_devices", lambda n: {"mlx5_0": "opened"})
    assert result(node, "ib.provider").status == core.OK


@pytest.mark.parametrize(
    "env, conf, words",
    [
        ({"NCCL_IB_DISABLE": "1"}, "", "NCCL_IB_DISABLE=1 (from environment)"),
        ({}, "NCCL_IB_DISABLE=1\n", "NCCL_IB_DISABLE=1 (from /etc/nccl.conf)"),
        ({"NCCL_SOCKET_IFNAME": "ib0"}, "", "matches no interface"),
        ({"NCCL_IB_HCA": "=mlx5_9"}, "", "matches none of mlx5_0"),
        ({"NCCL_TOPO_FILE": "/etc/topo.xml"}, "", "does not exist"),
    ],
)
def test_nccl_settings_that_contradict_the_node_fail(node, env, conf, words):
    node.rdma_device("mlx5_0", uverbs=0)
    node.write("/sys/class/net/eth0/operstate", "up")
    node.write("/etc/nccl.conf", conf)
    node.env.update(env)
    r = result(node, "nccl.env")
    assert r.status == core.FAIL and words in r.summary, r.summary


def test_nccl_settings_that_agree_pass(node):
    node.rdma_device("mlx5_0", uverbs=0)
    node.write("/sys/class/net/eth0/operstate", "up")
    node.env.update(NCCL_SOCKET_IFNAME="^lo,docker", NCCL_IB_HCA="mlx5", NCCL_DEBUG="INFO")
    assert result(node, "nccl.env").status == core.OK


def _azure_nd(node, gpus=8, vendor="Microsoft Corporation"):
    """An ND H100 v5 as its VM shows it: Hyper-V's DMI vendor, 8 NVIDIA 3D controllers, mlx5 HCAs."""
    node.write("/sys/class/dmi/id/sys_vendor", vendor)
    node.write("/sys/class/dmi/id/product_name", "Virtual Machine")
    for i in range(gpus):
        node.write(f"/sys/bus/pci/devices/000{i}:00:00.0/vendor", "0x10de")
        node.write(f"/sys/bus/pci/devices/000{i}:00:00.0/class", "0x030200")
    node.write("/sys/bus/pci/devices/0101:00:00.0/vendor", "0x15b3")
    node.write("/sys/bus/pci/devices/0101:00:00.0/class", "0x020700")
    node.rdma_device("mlx5_ib0", uverbs=0)
    node.write("/sys/class/net/eth0/operstate", "up")


def test_an_azure_nd_vm_without_a_reachable_topology_file_warns_with_the_mount(node):
    _azure_nd(node)
    r = result(node, "nccl.env")
    assert r.status == core.WARN, r.summary
    assert "Azure ND VM (8 GPUs, HCAs mlx5_ib0): no NCCL topology file reachable in this container" in r.summary
    assert "-v /opt/microsoft:/opt/microsoft:ro -e NCCL_TOPO_FILE=/opt/microsoft/ndv5/topo.xml" in r.summary


def test_an_azure_nd_vm_with_the_file_mounted_but_unnamed_is_told_the_variable(node):
    _azure_nd(node)
    node.write("/opt/microsoft/ndv5/topo.xml", "<system/>")
    r = result(node, "nccl.env")
    assert r.status == core.WARN and "set NCCL_TOPO_FILE=/opt/microsoft/ndv5/topo.xml" in r.summary, r.summary


def test_an_azure_nd_vm_with_its_topology_file_named_and_other_nodes_pass(node, tmp_path):
    _azure_nd(node)
    node.write("/opt/microsoft/ndv5/topo.xml", "<system/>")
    node.env["NCCL_TOPO_FILE"] = "/opt/microsoft/ndv5/topo.xml"
    assert result(node, "nccl.env").status == core.OK
    other = FakeNode(tmp_path / "other")
    _azure_nd(other, vendor="Dell Inc.")
    assert result(other, "nccl.env").status == core.OK
    cpu_vm = FakeNode(tmp_path / "cpu")
    _azure_nd(cpu_vm, gpus=0)
    assert result(cpu_vm, "nccl.env").status == core.OK


# --- MPI, NCCL, launch contract -------------------------------------------------------


def test_launcher_off_path_fails(tmp_path):
    r = result(FakeNode(tmp_path, env={"PATH": str(tmp_path / "empty-bin")}), "mpi.launcher")
    assert r.status == core.FAIL and "command not found" in r.summary and "/opt/openmpi/bin" in r.hint


def test_launcher_version_prefix_and_login_shell(tmp_path):
    prefix = tmp_path / "opt" / "openmpi"
    mpirun, mpiexec = fake_mpi_launchers(prefix)
    env = {"PATH": str(mpirun.parent)}
    manifest = {
        **MANIFEST,
        "components": {**MANIFEST["components"], "mpi": {"kind": "openmpi", "version": "4.1.4", "prefix": str(prefix)}},
    }
    answers = {
        f"{mpirun} --version": (0, "mpirun (Open MPI) 4.1.4\n"),
        f"{mpiexec} --version": (0, "mpiexec (OpenRTE) 4.1.4\n"),
        "bash -lc": (0, str(mpirun)),
    }
    r = result(FakeNode(tmp_path, env=env, commands=answers, manifest=manifest), "mpi.launcher")
    assert r.status == core.OK and "(openmpi 4.1.4)" in r.summary, r.summary
    assert r.facts["version"] == "4.1.4" and r.facts["mpiexec"] == str(mpiexec)
    other = dict(
        manifest,
        components={
            **manifest["components"],
            "mpi": {"kind": "openmpi", "version": "4.1.4", "prefix": "/usr/lib/x86_64-linux-gnu/openmpi"},
        },
    )
    r = result(FakeNode(tmp_path, env=env, commands=answers, manifest=other), "mpi.launcher")
    assert r.status == core.FAIL and "not under the manifest's MPI prefix" in r.summary
    wrong = dict(answers, **{f"{mpirun} --version": (0, "mpirun (Open MPI) 3.1.2\n")})
    r = result(FakeNode(tmp_path, env=env, commands=wrong, manifest=manifest), "mpi.launcher")
    assert r.status == core.FAIL and "reports 3.1.2, the manifest says 4.1.4" in r.summary
    no_login = dict(answers, **{"bash -lc": (1, "")})
    r = result(FakeNode(tmp_path, env=env, commands=no_login, manifest=manifest), "mpi.launcher")
    assert r.status == core.FAIL and "login shell" in r.summary


def test_nccl_hidden_and_wrong_version_fail(tmp_path):
    r = result(FakeNode(tmp_path), "nccl.library")
    assert r.status == core.FAIL and "does not load" in r.summary and r.hint
    n = FakeNode(tmp_path, libs={"libnccl.so.2": (FakeNccl(22203), NCCL_PATH)})
    r = result(n, "nccl.library")
    assert r.status == core.FAIL and "NCCL 2.22.3" in r.summary and "2.27.5" in r.summary
    n = FakeNode(tmp_path, libs={"libnccl.so.2": (FakeNccl(22705), NCCL_PATH)})
    assert result(n, "nccl.library").status == core.OK


def test_a_second_nccl_earlier_on_the_library_path_is_named(tmp_path):
    image_lib = tmp_path / NCCL_PATH.lstrip("/")
    image_lib.parent.mkdir(parents=True)
    image_lib.write_bytes(b"nccl")
    shadow = tmp_path / "opt" / "shadow" / "libnccl.so.2"
    shadow.parent.mkdir(parents=True)
    shadow.write_bytes(b"nccl")
    ldconfig = (0, f"\tlibnccl.so.2 (libc6,x86-64) => {NCCL_PATH}\n")
    n = FakeNode(tmp_path, env={"LD_LIBRARY_PATH": "/opt/shadow"}, commands={"ldconfig -p": ldconfig})
    r = result(n, "nccl.shadow")
    assert r.status == core.FAIL and "2 different NCCL" in r.summary
    assert f"{shadow} (LD_LIBRARY_PATH" in r.summary and f"{image_lib} (ldconfig cache" in r.summary
    r = result(FakeNode(tmp_path, commands={"ldconfig -p": ldconfig}), "nccl.shadow")
    assert r.status == core.OK, r.summary


def ompi(rank, size=4, local=2, **extra):
    env = {
        "OMPI_COMM_WORLD_RANK": rank,
        "OMPI_COMM_WORLD_SIZE": size,
        "OMPI_COMM_WORLD_LOCAL_RANK": rank % local,
        "OMPI_COMM_WORLD_LOCAL_SIZE": local,
        "OMPI_COMM_WORLD_NODE_RANK": rank % local,
        "MASTER_ADDR": "a",
    }
    return {k: str(v) for k, v in {**env, **extra}.items()}


@pytest.mark.parametrize(
    "env, words",
    [
        (ompi(3, RANK=0), "RANK=0 (the launcher's RANK is 3)"),
        (ompi(2, NODE_RANK=0), "NODE_RANK=0 (the launcher's NODE_RANK is 1)"),
        (ompi(1, LOCAL_RANK=1, WORLD_SIZE=2), "WORLD_SIZE=2 (the launcher's WORLD_SIZE is 4)"),
        ({"RANK": "4", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}, "inconsistent values"),
        ({k: v for k, v in ompi(2).items() if k != "MASTER_ADDR"}, "no master address"),
    ],
)
def test_inconsistent_rank_variables_fail(tmp_path, env, words):
    r = result(FakeNode(tmp_path, env=env), "launch.contract")
    assert r.status == core.FAIL and words in r.summary and r.hint, r.summary


def test_consistent_launch_passes(tmp_path):
    r = result(FakeNode(tmp_path, env=ompi(3, RANK=3, NODE_RANK=1)), "launch.contract")
    assert r.status == core.OK and "rank 3/4" in r.summary and "node 1/2" in r.summary
    assert result(FakeNode(tmp_path, env={}), "launch.contract").status == core.OK


# --- what NCCL says about its network ---------------------------------------------------

IB_LOG = """h:1:1 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.
h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.4<0>
h:1:1 [0] NCCL INFO Using network IB
"""
SOCKET_LOG = """h:1:1 [0] NCCL INFO NET/IB : No device found.
h:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:172.17.0.2<0>
h:1:1 [0] NCCL INFO Using network Socket
"""
OLD_SOCKET_LOG = (
    "h:1:1 [0] NCCL INFO NET/IB : No device found.\nh:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:1.2.3.4<0>\n"
)


def test_nccl_log_parsing():
    ib = stack.parse_nccl_network(IB_LOG)
    assert ib["network"] == "IB" and ib["ib"].startswith("[0]mlx5_0:1/IB") and "Could not find" in ib["plugin"]
    sock = stack.parse_nccl_network(SOCKET_LOG)
    assert sock["network"] == "Socket" and sock["ib"] == "no device found" and sock["socket"] == "[0]eth0:172.17.0.2<0>"
    assert stack.parse_nccl_network(OLD_SOCKET_LOG)["network"] == "Socket"
    assert stack.parse_nccl_network("nothing here")["network"] is None


@pytest.mark.parametrize(
    "log, devices, status", [(IB_LOG, True, core.OK), (SOCKET_LOG, True, core.FAIL), (SOCKET_LOG, False, core.WARN)]
)
def test_nccl_network_verdict(tmp_path, monkeypatch, log, devices, status):
    n = FakeNode(tmp_path, libs={"libcuda.so.1": (FakeCuda(), "/usr/lib/libcuda.so.1")})
    if devices:
        n.rdma_device("mlx5_0", uverbs=0)
    n.commands = {"": (0, log)}  # the probe's output stands in for NCCL's debug file
    r = result(n, "nccl.network")
    assert r.status == status, r.summary
    if status == core.FAIL:
        assert "sockets although mlx5_0" in r.summary and "no device found" in r.summary


def test_version_codes_round_trip():
    assert stack.nccl_version_code("2.27.5") == 22705 and stack.nccl_version_name(22705) == "2.27.5"
    assert stack.nccl_version_code("2.8.4") == 2804 and stack.nccl_version_name(2804) == "2.8.4"
    assert ctypes.sizeof(ctypes.c_int) == 4


# -- mem.cma: which single-copy path the node's MPI can use (issue 28) ---------------------------
def test_cma_refused_warns_and_names_every_runtime_fix(tmp_path):
    r = result(FakeNode(tmp_path, cma=1), "mem.cma")
    assert r.status == core.WARN and "refused" in r.summary and r.facts["single_copy"] == "none (refused)"
    for fix in ("--cap-add SYS_PTRACE", "securityContext", "ch-run --join", "--sharens"):
        assert fix in r.hint, fix


def test_cma_working_is_ok_and_says_when_the_image_switched_single_copy_off(tmp_path):
    assert result(FakeNode(tmp_path, cma=0), "mem.cma").facts["single_copy"] == "cma"
    r = result(FakeNode(tmp_path, cma=0, env={"OMPI_MCA_btl_vader_single_copy_mechanism": "none"}), "mem.cma")
    assert r.status == core.OK and r.facts["single_copy"] == "none (configured)"


def test_cma_yama_scope_2_is_named(tmp_path):
    n = FakeNode(tmp_path, cma=1)
    n.write("/proc/sys/kernel/yama/ptrace_scope", "2")
    assert "ptrace_scope 2" in result(n, "mem.cma").summary


def test_the_real_cma_probe_reads_a_sibling_process_on_this_host():
    """The probe itself, for real: on this host (no seccomp filter on the test process) two
    sibling processes can read each other's memory."""
    assert core.Node().cma_probe() == 0


# --- the fabric NCCL finds (issue 70): EFA is not InfiniBand ----------------------------------------

PLUGIN_LOG = """h:1:1 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.21.1
h:1:1 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 4 nics)
h:1:1 [0] NCCL INFO Using network Libfabric
"""


# NCCL 2.30's log where the image's aws-ofi-nccl declines a node without EFA (it asks libfabric
# for efa only) and NCCL takes its own IB transport
DECLINED_LOG = """h:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v12)
h:1:1 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.21.1
h:1:1 [0] NCCL WARN NET/OFI Couldn't find any optimal provider
h:1:1 [0] NCCL INFO Failed to initialize NET plugin Libfabric
h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>
h:1:1 [0] NCCL INFO Using network IB
"""
PLUGIN_FILES = [f"/opt/amazon/ofi-nccl/lib/{n}" for n in ("libnccl-net.so", "libnccl-net-ofi.so")]
WITH_PLUGIN = {
    **MANIFEST,
    "components": {
        **MANIFEST["components"],
        "nccl_net_plugin": {"name": "aws-ofi-nccl", "version": "1.21.1", "files": PLUGIN_FILES},
    },
}


def _node_with(
    tmp_path, device: str, driver: str, log: str, link_layer: str | None = None, manifest: dict = MANIFEST
) -> FakeNode:
    n = FakeNode(tmp_path, libs={"libcuda.so.1": (FakeCuda(), "/usr/lib/libcuda.so.1")}, manifest=manifest)
    n.rdma_device(device, uverbs=0, driver=driver)
    if link_layer:
        n.write(f"/sys/class/infiniband/{device}/ports/1/link_layer", link_layer)
    n.commands = {"": (0, log)}
    return n


def test_efa_devices_with_nccl_on_sockets_fail_with_the_plugin_fix_not_ib_settings(tmp_path):
    r = result(_node_with(tmp_path, "rdmap16s27", "efa", SOCKET_LOG), "nccl.network")
    assert r.status == core.FAIL and "AWS EFA devices here (rdmap16s27)" in r.summary, r.summary
    assert "aws-ofi-nccl" in r.hint and "never NCCL_NET=IB" in r.hint and "NCCL_IB_DISABLE" not in r.hint
    assert r.facts["fabric"] == ["efa"]


def test_efa_devices_with_the_plugin_selected_pass_naming_the_fabric(tmp_path):
    r = result(_node_with(tmp_path, "rdmap16s27", "efa", PLUGIN_LOG), "nccl.network")
    assert r.status == core.OK and r.summary == "NCCL selected Libfabric on efa", r.summary


def test_a_plugin_on_an_infiniband_node_warns_as_a_stray(tmp_path):
    r = result(_node_with(tmp_path, "mlx5_0", "mlx5_core", PLUGIN_LOG), "nccl.network")
    assert r.status == core.WARN and "without EFA devices (infiniband here)" in r.summary, r.summary


def test_roce_on_sockets_names_the_gid_index_and_ib_names_itself(tmp_path):
    r = result(_node_with(tmp_path / "roce", "mlx5_0", "mlx5_core", SOCKET_LOG, link_layer="Ethernet"), "nccl.network")
    assert r.status == core.FAIL and "NCCL_IB_GID_INDEX" in r.hint and r.facts["fabric"] == ["roce"]
    ok = result(_node_with(tmp_path / "ib", "mlx5_0", "mlx5_core", IB_LOG), "nccl.network")
    assert ok.status == core.OK and ok.summary.startswith("NCCL selected IB on infiniband"), ok.summary


def test_efa_node_whose_image_carries_the_plugin_but_nccl_took_sockets_says_why_not_install_it(tmp_path):
    """The same EFA node on an image with aws-ofi-nccl: the fix is not "install a plugin" but why
    the image's plugin did not take EFA (variables that keep it out, the devices, memlock)."""
    r = result(_node_with(tmp_path, "rdmap16s27", "efa", SOCKET_LOG, manifest=WITH_PLUGIN), "nccl.network")
    assert r.status == core.FAIL and "AWS EFA devices here" in r.summary, r.summary
    assert "this image carries aws-ofi-nccl 1.21.1 (/opt/amazon/ofi-nccl/lib/libnccl-net.so)" in r.hint, r.hint
    assert "NCCL_NET_PLUGIN" in r.hint and "FI_PROVIDER" in r.hint and "uverbs" in r.hint
    assert "use a trainbase amd64 image" not in r.hint


def test_infiniband_node_where_the_images_plugin_declines_keeps_nccls_ib_and_passes(tmp_path):
    """An InfiniBand node on an image with the plugin: the plugin is tried and declines, NCCL
    keeps its own IB transport, exactly as on an image without it."""
    r = result(_node_with(tmp_path, "mlx5_0", "mlx5_core", DECLINED_LOG, manifest=WITH_PLUGIN), "nccl.network")
    assert r.status == core.OK and r.summary.startswith("NCCL selected IB on infiniband"), r.summary
