"""tb-doctor's GPUDirect RDMA checks on NCCL INFO logs in NCCL's own formats (the excerpts in
fixtures/nccl_gdr, each line's format string and source in its README) and on fake sysfs trees:
failing, with the reason, wherever NCCL moves data between nodes through host memory (no
nvidia_peermem and no DMA-BUF, an NCCL_* setting, the GPU too far from the HCA, sockets), passing
where every NET channel is GDRDMA, not applicable without GPUs or RDMA devices."""

import importlib
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import jsonschema
import pytest

from trainbase_conformance.checks import test_gpudirect

from .conftest import ROOT
from .doctor_fakes import FakeCuda, FakeNode, core, result

gdr = importlib.import_module("trainbase_doctor.checks_gpudirect")
cli = importlib.import_module("trainbase_doctor.cli")
LOGS = Path(__file__).parent / "fixtures" / "nccl_gdr"
DOCTOR_SCHEMA = json.loads((ROOT / "docs" / "doctor.schema.json").read_text())


class DoctorTarget:
    """A target whose image answers `tb-doctor --json ARGS` as the doctor does on ``make_node(expect)``
    (as test_doctor_tier_checks.DoctorTarget, which the suite's own Target.doctor mirrors)."""

    def __init__(self, make_node):
        self.make_node = make_node

    def doctor(self, args: str = ""):
        a = cli.parser().parse_args(["--json", *args.split()])
        node = self.make_node(tuple(e for e in a.expect.split(",") if e))
        results = core.run_checks(node, core.select([o for o in (a.only or "").split(",") if o]))
        report = json.loads(json.dumps(cli.node_report(node, results, 0.2)))
        jsonschema.validate(report, DOCTOR_SCHEMA)
        return report["exit_code"], report


def gdr_node(
    root: Path,
    *,
    gpus: int = 1,
    hcas: tuple[str, ...] = ("mlx5_0",),
    kernel: str = "5.15.0-125-generic",
    driver: str = "NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 2024",
    peermem: bool = False,
    dmabuf_attr: bool | None = None,
    expect: tuple[str, ...] = (),
    log: str | None = None,
) -> FakeNode:
    """A node with ``gpus`` GPUs and ``hcas`` handed in; the kernel and driver as given; ``log``, a
    fixture read as --nccl-log reads it."""
    libs = {"libcuda.so.1": (FakeCuda(gpus=gpus, dmabuf=dmabuf_attr), "/usr/lib/libcuda.so.1")} if gpus else {}
    node = FakeNode(root, libs=libs, expect=expect)
    for i, name in enumerate(hcas):
        node.rdma_device(name, uverbs=i)
    node.write("/proc/sys/kernel/osrelease", kernel)
    node.write("/proc/driver/nvidia/version", f"NVRM version: {driver}")
    if peermem:
        node.write("/sys/module/nvidia_peermem/version", "550.127.05")
    if log:
        node.write("/var/log/nccl.log", (LOGS / log).read_text())
        node.nccl_log = "/var/log/nccl.log"
    return node


def gdr_result(tmp_path: Path, log: str, **kw) -> core.Result:
    return result(gdr_node(tmp_path, log=log, **kw), "gpudirect.nccl")


# --------------------------------------------------------------------------- the parser


def test_every_fixture_parses_to_its_version_network_and_channels():
    seen = {f.name: gdr.parse_nccl_gdr(f.read_text()) for f in sorted(LOGS.glob("*.log"))}
    assert len(seen) == 9
    two = seen["gdr-2.21-two-nodes.log"]
    assert two["version"] == (2, 21, 5) and two["network"] == "IB" and two["hca_names"] == {0: "mlx5_0", 1: "mlx5_1"}
    assert len(two["channels"]) == 6 and all(c["gdr"] for c in two["channels"]) and two["dmabuf_gpus"] == [0]
    assert two["pairs"][0] == {
        "rank": 0,
        "hca": 0,
        "gdr": True,
        "distance": 4,
        "level": 4,
        "line": "GPU Direct RDMA Enabled for GPU 1b000 / HCA 0 (distance 4 <= 4)",
    }
    proxy = seen["gdr-2.30-proxy.log"]["channels"]
    assert [c["hca"] for c in proxy] == [0, 1, 0, 1] and all(c["gdr"] for c in proxy)
    old = seen["nogdr-2.12-no-module.log"]
    assert old["version"] == (2, 12, 12) and old["hcas"][0]["said"] == "no module"
    assert [c["gpu"] for c in old["channels"]] == ["1b000"] * 4 and not any(c["gdr"] for c in old["channels"])
    assert seen["nogdr-2.27-env-level.log"]["env"] == {"NCCL_NET_GDR_LEVEL": "LOC"}
    assert seen["nogdr-2.23-gdr-read.log"]["env"] == {"NCCL_NET_GDR_READ": "0"}  # param.cc's "%lld." dot gone
    far = seen["nogdr-2.29-distance.log"]["pairs"]
    assert far[0]["rank"] == 0 and far[0]["hca"] == 0 and (far[0]["distance"], far[0]["level"]) == (8, 6)
    assert seen["socket-2.30.log"]["network"] == "Socket"


def test_distance_names_follow_each_release_s_path_types():
    assert gdr.path_type_names((2, 21, 5))[4] == "PXB" and gdr.path_type_names((2, 30, 7))[8] == "PHB"
    assert gdr.path_type_names((2, 27, 3))[6:8] == ["PXN", "P2C"] and gdr.path_type_names((2, 27, 7))[6] == "P2C"
    assert gdr.path_type_names(None) is None


# --------------------------------------------------------------------------- the verdict on a job's log


@pytest.mark.parametrize("log", ["gdr-2.21-two-nodes.log", "gdr-2.30-proxy.log"])
def test_a_log_where_every_net_channel_is_gdrdma_passes(tmp_path, log):
    r = gdr_result(tmp_path, log, peermem=True)
    assert r.status == core.OK and r.summary.startswith("every NET channel is GDRDMA"), r.summary
    assert r.facts["net_channels"] == r.facts["gdr_channels"] > 0


def test_no_module_fails_naming_peermem(tmp_path):
    r = gdr_result(tmp_path, "nogdr-2.12-no-module.log", kernel="5.4.0-150-generic")
    assert r.status == core.FAIL and "through host memory (4 of 4 NET channels" in r.summary, r.summary
    assert (
        "GPU 1b000 -> mlx5_0 [receive, send]: mlx5_0: no nvidia_peermem and no DMA-BUF (this node: kernel "
        "5.4.0-150-generic < 5.12" in r.summary
    )
    assert r.hint == gdr.PEERMEM_FIX


def test_a_disabled_hca_without_a_reason_in_the_log_takes_it_from_the_kernel_side(tmp_path):
    r = gdr_result(tmp_path, "nogdr-2.30-no-peermem.log")  # 5.15, but the proprietary driver: no DMA-BUF
    assert r.status == core.FAIL, r.summary
    assert (
        "GPU 0 -> mlx5_0 [receive, send]: mlx5_0: no nvidia_peermem and no DMA-BUF (this node: the NVIDIA "
        "driver is not the open kernel modules (550))" in r.summary
    )
    loaded = gdr_result(tmp_path / "b", "nogdr-2.30-no-peermem.log", peermem=True)
    assert loaded.status == core.FAIL and "although nvidia_peermem is loaded" in loaded.summary, loaded.summary


@pytest.mark.parametrize(
    "log, words",
    [
        ("nogdr-2.27-env-level.log", "NCCL_NET_GDR_LEVEL=LOC (from NCCL's log) forbids GPUDirect RDMA"),
        ("nogdr-2.23-gdr-read.log", "NCCL_NET_GDR_READ=0 (from NCCL's log) keeps sends from reading GPU memory"),
        ("nogdr-2.30-dmabuf-off.log", "no nvidia_peermem and NCCL_DMABUF_ENABLE=0 (from NCCL's log)"),
    ],
)
def test_an_nccl_setting_fails_naming_itself(tmp_path, log, words):
    r = gdr_result(tmp_path, log)
    assert r.status == core.FAIL and words in r.summary, r.summary
    assert gdr.ENV_FIX in r.hint


def test_gdr_read_off_stages_sends_only(tmp_path):
    r = gdr_result(tmp_path, "nogdr-2.23-gdr-read.log")
    assert "(1 of 2 NET channels" in r.summary and r.facts["staged"] == [
        "GPU 0 -> mlx5_0 [send]: NCCL_NET_GDR_READ=0 (from NCCL's log) keeps sends from reading GPU memory"
    ]


def test_gpu_and_hca_too_far_apart_fail_with_nccl_s_distance_named(tmp_path):
    r = gdr_result(tmp_path, "nogdr-2.29-distance.log", peermem=True)
    assert r.status == core.FAIL and "GPU 0 and mlx5_0 are too far apart (distance PHB > P2C, NCCL's log)" in r.summary
    assert gdr.DISTANCE_FIX in r.hint
    level = gdr_result(tmp_path / "b", "nogdr-2.27-env-level.log", peermem=True)
    assert "distance PXB > LOC" in level.summary, level.summary


def test_a_gdr_level_below_the_distance_is_named_where_nccl_logs_no_distance(tmp_path):
    node = gdr_node(tmp_path, peermem=True, log="gdr-2.30-proxy.log")
    node.write(
        "/var/log/nccl.log",
        (LOGS / "gdr-2.30-proxy.log").read_text().replace("/GDRDMA", "")
        + "h:1:1 [0] NCCL INFO NCCL_NET_GDR_LEVEL set by environment to PIX\n",
    )
    r = result(node, "gpudirect.nccl")
    assert r.status == core.FAIL and "NCCL_NET_GDR_LEVEL=PIX (from NCCL's log) allows GPUDirect RDMA only" in r.summary
    unexplained = gdr_result(tmp_path / "b", "gdr-2.30-proxy.log", peermem=True)
    assert unexplained.status == core.OK


def test_sockets_fail_as_host_memory(tmp_path):
    r = gdr_result(tmp_path, "socket-2.30.log", peermem=True)
    assert r.status == core.FAIL and "NCCL's network is sockets" in r.summary and "nccl.network" in r.hint


def test_a_log_without_gdr_lines_warns(tmp_path):
    node = gdr_node(tmp_path)
    node.write("/var/log/empty.log", "h:1:1 [0] NCCL INFO Bootstrap : Using eth0\n")
    node.nccl_log = "/var/log/empty.log"
    r = result(node, "gpudirect.nccl")
    assert r.status == core.WARN and "says nothing about GPU Direct RDMA" in r.summary


def test_the_cli_reads_a_log_with_nccl_log_and_its_json_validates(tmp_path, monkeypatch):
    def node(expect=(), nccl_log=None):
        n = gdr_node(tmp_path / f"n{len(list(tmp_path.iterdir()))}", peermem=True, expect=expect)
        n.nccl_log = nccl_log
        n.write(nccl_log, Path(nccl_log).read_text())  # the fake node reads the host path under its root
        return n

    monkeypatch.setattr(cli, "Node", node)
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli.main(["--json", "--only", "gpudirect", "--nccl-log", str(LOGS / "nogdr-2.12-no-module.log")])
    report = json.loads(out.getvalue())
    jsonschema.validate(report, DOCTOR_SCHEMA)
    assert code == 1 and [(c["id"], c["status"]) for c in report["checks"]] == [
        ("gpudirect.kernel", "ok"),
        ("gpudirect.nccl", "fail"),
    ]
    with redirect_stdout(io.StringIO()):
        assert cli.main(["--only", "gpudirect.nccl", "--nccl-log", str(LOGS / "gdr-2.21-two-nodes.log")]) == 0
    with pytest.raises(SystemExit), redirect_stdout(io.StringIO()):
        cli.main(["--nccl-log", str(tmp_path / "missing.log")])


# --------------------------------------------------------------------------- where it applies, and the probe


def test_not_applicable_without_gpus_or_rdma_devices(tmp_path):
    for node, words in ((gdr_node(tmp_path / "a", gpus=0), "no GPU"), (gdr_node(tmp_path / "b", hcas=()), "no RDMA")):
        for check_id in ("gpudirect.kernel", "gpudirect.nccl"):
            r = result(node, check_id)
            assert r.status == core.SKIP and r.summary.startswith("skipped: not applicable") and words in r.summary
    r = result(gdr_node(tmp_path / "c", hcas=(), expect=("ib",)), "gpudirect.nccl")
    assert r.status == core.FAIL and "--expect ib" in r.summary


def test_without_a_log_the_check_runs_nccl_over_two_gpus_through_the_hca(tmp_path):
    node = gdr_node(tmp_path, gpus=8, peermem=True)
    calls = []

    def run(argv, timeout=20, env=None):
        calls.append((argv, env))
        return 0, (LOGS / "gdr-2.21-two-nodes.log").read_text()  # its output stands in for NCCL_DEBUG_FILE

    node.run = run
    r = result(node, "gpudirect.nccl")
    assert r.status == core.OK and "a one-process NCCL communicator over 2 GPU(s)" in r.summary, r.summary
    argv, env = calls[0]
    assert argv[-1] == "2" and env["NCCL_P2P_DISABLE"] == env["NCCL_SHM_DISABLE"] == "1"
    assert env["NCCL_RUNTIME_CONNECT"] == "0" and env["NCCL_DEBUG"] == "INFO" and "NET" in env["NCCL_DEBUG_SUBSYS"]


def test_one_gpu_judges_nccl_s_per_hca_verdict(tmp_path):
    node = gdr_node(tmp_path, gpus=1)
    node.commands = {
        "": (
            0,
            "h:1:1 [0] NCCL INFO NCCL version 2.30.7+cuda13.0\n"
            "h:1:1 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'\n",
        )
    }
    r = result(node, "gpudirect.nccl")
    assert r.status == core.FAIL and "mlx5_0 (every GPU): mlx5_0: no nvidia_peermem and no DMA-BUF" in r.summary
    node2 = gdr_node(tmp_path / "b", gpus=1, peermem=True)
    node2.commands = {"": (0, "h:1:1 [0] NCCL INFO NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'\n")}
    ok = result(node2, "gpudirect.nccl")
    assert ok.status == core.OK and "no channel through the network in this log" in ok.summary


# --------------------------------------------------------------------------- the kernel side on fake sysfs


@pytest.mark.parametrize(
    "setup, status, words",
    [
        (dict(peermem=True), core.OK, "nvidia_peermem loaded"),
        (
            dict(
                kernel="6.8.0-49-generic", driver="NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build"
            ),
            core.OK,
            "DMA-BUF: kernel 6.8.0-49-generic, NVIDIA open kernel modules",
        ),
        (dict(kernel="6.8.0-49-generic", dmabuf_attr=True), core.OK, "the driver says the GPU supports it"),
        (
            dict(kernel="5.4.0-150-generic"),
            core.FAIL,
            "neither nvidia_peermem nor DMA-BUF: kernel 5.4.0-150-generic < 5.12; the NVIDIA driver is not the open kernel "
            "modules (550)",
        ),
        (
            dict(
                kernel="6.8.0-49-generic", driver="NVIDIA UNIX Open Kernel Module for x86_64  510.47.03  Release Build"
            ),
            core.FAIL,
            "driver 510 < 515",
        ),
        (
            dict(
                kernel="6.8.0-49-generic",
                dmabuf_attr=False,
                driver="NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build",
            ),
            core.FAIL,
            "the driver says the GPU does not support DMA-BUF (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 0)",
        ),
    ],
)
def test_kernel_side(tmp_path, setup, status, words):
    r = result(gdr_node(tmp_path, **setup), "gpudirect.kernel")
    assert r.status == status and words in r.summary, r.summary
    if status == core.FAIL:
        assert r.hint == gdr.PEERMEM_FIX


def test_kernel_side_reads_proc_modules_and_the_kernel_config(tmp_path):
    node = gdr_node(tmp_path)
    node.write(
        "/proc/modules", "nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)\nnvidia 56598528 1 nvidia_peermem\n"
    )
    assert result(node, "gpudirect.kernel").status == core.OK
    off = gdr_node(tmp_path / "b", kernel="6.8.0-49-generic", dmabuf_attr=True)
    off.write("/boot/config-6.8.0-49-generic", "CONFIG_DMA_SHARED_BUFFER=n\n")
    r = result(off, "gpudirect.kernel")
    assert r.status == core.FAIL and "without CONFIG_DMA_SHARED_BUFFER" in r.summary


def pci_tree(node: FakeNode) -> None:
    """GPU 0000:1b:00.0 behind a PCIe switch on root complex pci0000:17 (NUMA 0) with mlx5_0; mlx5_1 on
    root complex pci0000:ca (NUMA 1)."""
    devices = {
        "0000:1b:00.0": ("pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:00.0/0000:1b:00.0", 0, "0x10de", "0x030200"),
        "0000:1c:00.0": ("pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:01.0/0000:1c:00.0", 0, "0x15b3", "0x020700"),
        "0000:cb:00.0": ("pci0000:ca/0000:ca:01.0/0000:cb:00.0", 1, "0x15b3", "0x020700"),
    }
    for addr, (path, numa, vendor, cls) in devices.items():
        real = node.path(f"/sys/devices/{path}")
        for f, v in (("numa_node", str(numa)), ("vendor", vendor), ("class", cls)):
            node.write(f"/sys/devices/{path}/{f}", v)
        link = node.path(f"/sys/bus/pci/devices/{addr}")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(real)
    for name, addr in (("mlx5_0", "0000:1c:00.0"), ("mlx5_1", "0000:cb:00.0")):
        dev = node.path(f"/sys/class/infiniband/{name}/device")
        dev.parent.mkdir(parents=True, exist_ok=True)
        dev.symlink_to(node.path(f"/sys/bus/pci/devices/{addr}").resolve())


def test_placement_from_sysfs_names_pcie_switch_and_numa(tmp_path):
    node = FakeNode(tmp_path)
    pci_tree(node)
    for i, name in enumerate(("mlx5_0", "mlx5_1")):
        node.rdma_device(name, uverbs=i)
    p = gdr.placement(node)
    assert p["gpus"] == [{"pci": "0000:1b:00.0", "numa": 0}]
    assert p["hcas"] == {"mlx5_0": {"pci": "0000:1c:00.0", "numa": 0}, "mlx5_1": {"pci": "0000:cb:00.0", "numa": 1}}
    assert p["pairs"] == {"0000:1b:00.0": {"mlx5_0": "PXB", "mlx5_1": "SYS"}}


def test_a_channel_on_a_far_hca_without_a_reason_in_the_log_is_explained_by_sysfs(tmp_path):
    node = gdr_node(tmp_path, hcas=(), peermem=True)
    pci_tree(node)
    for i, name in enumerate(("mlx5_0", "mlx5_1")):
        node.rdma_device(name, uverbs=i)
    text = "\n".join(
        [
            "h:1:1 [0] NCCL INFO NCCL version 2.30.7+cuda13.0",
            "h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.11<0>",
            "h:1:1 [0] NCCL INFO NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'",
            "h:1:1 [0] NCCL INFO NET/IB : GPU Direct RDMA Enabled for HCA 1 'mlx5_1'",
            "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
            "h:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/1",
        ]
    )
    node.write("/var/log/nccl.log", text)
    node.nccl_log = "/var/log/nccl.log"
    r = result(node, "gpudirect.nccl")
    assert r.status == core.FAIL and "GPU 0 (0000:1b:00.0) and mlx5_1 are SYS apart" in r.summary, r.summary


# --------------------------------------------------------------------------- the fabric tier's check


def test_the_fabric_tier_s_gpudirect_check_fails_where_the_kernel_offers_neither_path(tmp_path):
    def make(expect):
        node = gdr_node(tmp_path, expect=expect, kernel="5.4.0-150-generic")
        node.commands = {"": (0, (LOGS / "nogdr-2.30-no-peermem.log").read_text())}
        return node

    with pytest.raises(
        AssertionError,
        match=r"gpudirect\.kernel: neither nvidia_peermem nor DMA-BUF: kernel "
        r"5\.4\.0-150-generic < 5\.12",
    ):
        test_gpudirect.test_gpudirect_rdma_on_an_rdma_runner(DoctorTarget(make))


def test_the_fabric_tier_s_gpudirect_check_fails_on_nccl_staging_through_host_memory(tmp_path):
    def make(expect):
        node = gdr_node(tmp_path, expect=expect, peermem=True)
        node.commands = {"": (0, (LOGS / "nogdr-2.29-distance.log").read_text())}
        return node

    with pytest.raises(AssertionError, match=r"gpudirect\.nccl: NCCL moves data between nodes through host memory"):
        test_gpudirect.test_gpudirect_rdma_on_an_rdma_runner(DoctorTarget(make))


def test_the_fabric_tier_s_gpudirect_check_passes_with_gdrdma_and_skips_without_gpus(tmp_path):
    def make(expect):
        node = gdr_node(tmp_path, expect=expect, peermem=True)
        node.commands = {"": (0, (LOGS / "gdr-2.21-two-nodes.log").read_text())}
        return node

    test_gpudirect.test_gpudirect_rdma_on_an_rdma_runner(DoctorTarget(make))
    with pytest.raises(pytest.skip.Exception, match="no GPU"):
        test_gpudirect.test_gpudirect_rdma_on_an_rdma_runner(
            DoctorTarget(lambda e: gdr_node(tmp_path / "b", gpus=0, expect=e))
        )
