"""InfiniBand userspace: libraries and the providers the manifest claims load, the tools are
there, UCX carries IB, and without a device everything says so cleanly.

Expectations come from the manifest's components.ib (kind, providers) and components.ucx."""
import re

import pytest

from .conftest import PROBE_DIR

TOOLS = ("ibv_devinfo", "ibv_devices", "ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_write_lat", "ibstat",
         "rdma")
NO_DEVICE = re.compile(r"(?i)(no (ib|rdma|infiniband)[ /\w]* devices? found|failed to get ib devices list|"
                       r"unable to find the infiniband/roce device|did not detect devices|no such device)")


def _verbs(target) -> dict:
    if "verbs" not in target.cache:
        providers = " ".join(target.components["ib"].get("providers") or [])
        target.cache["verbs"] = target.json_probe(f"{target.python} {PROBE_DIR}/verbs.py {providers}")
    return target.cache["verbs"]


@pytest.mark.static
def test_verbs_libraries_load(target):
    """libibverbs and librdmacm load (dlopen)."""
    libs = _verbs(target)["libs"]
    bad = {k: v for k, v in libs.items() if v != "loaded"}
    assert not bad, f"RDMA libraries do not load: {bad}"


@pytest.mark.static
def test_verbs_providers(target):
    """Every provider the manifest lists has its driver entry and a plugin that loads."""
    claimed = target.components["ib"].get("providers") or []
    assert "mlx5" in claimed, f"manifest lists providers {claimed}: mlx5 (ConnectX) is the minimum"
    info = _verbs(target)
    assert info["libs"].get("libibverbs.so.1") == "loaded", f"libibverbs does not load: {info['libs']}"
    problems = []
    for name in claimed:
        p = info["providers"].get(name, {})
        if not p.get("driver_file"):
            problems.append(f"{name}: no /etc/libibverbs.d/{name}.driver")
        if not p.get("plugin"):
            problems.append(f"{name}: no lib{name}-rdmav*.so next to libibverbs")
        elif p.get("load") != "loaded":
            problems.append(f"{name}: {p.get('load')}")
    assert not problems, "; ".join(problems)


@pytest.mark.static
def test_mlx5_direct_verbs(target):
    """libmlx5 (mlx5 direct verbs, what UCX's accelerated transports use) is in the linker cache."""
    if "mlx5" not in (target.components["ib"].get("providers") or []):
        pytest.skip("n/a: the manifest claims no mlx5 provider")
    r = target.sh("ldconfig -p")
    assert re.search(r"^\s*libmlx5\.so\.1 ", r.stdout, re.M), "libmlx5.so.1 is not in ldconfig -p"


@pytest.mark.static
def test_rdma_tools_present(target):
    """ibv_devinfo, perftest and diagnostics are on PATH."""
    r = target.sh("for t in " + " ".join(TOOLS) + "; do command -v $t >/dev/null || echo $t; done")
    missing = r.stdout.split()
    assert not missing, f"not on PATH: {missing}"


@pytest.mark.static
def test_ucx_version(target):
    """ucx_info reports the UCX version the manifest names."""
    want = target.components["ucx"]["version"]
    r = target.sh("ucx_info -v")
    m = re.search(r"(?m)^# Version (\S+)", r.stdout)
    assert m, f"ucx_info -v printed no version (rc {r.rc}): {(r.stdout or r.stderr)[:300]}"
    assert m.group(1) == want, f"UCX {m.group(1)} in the image, manifest says {want}"


@pytest.mark.static
def test_ucx_built_with_ib(target):
    """UCX has IB (verbs) support compiled in: HAVE_IB and the ib transport module."""
    r = target.sh("ucx_info -b")
    assert r.rc == 0, f"ucx_info -b exited {r.rc}: {r.stderr.strip()}"
    defines = dict(re.findall(r"(?m)^#define\s+(\w+)\s+(.*?)\s*$", r.stdout))
    assert defines.get("HAVE_IB") == "1", "ucx_info -b: HAVE_IB is not 1"
    modules = defines.get("uct_MODULES", "").strip('"').split(":")
    assert "ib" in modules, f"ucx_info -b: uct modules {modules} have no ib"


@pytest.mark.cpu
def test_no_device_fails_cleanly(target):
    """Without RDMA devices the tools exit non-zero with a 'no device' message, not a crash."""
    if target.caps.ib:
        pytest.skip("n/a: this host passes RDMA devices in (the fabric tier covers them)")
    info = _verbs(target)
    assert info.get("devices") == 0, f"libibverbs lists devices on a host without RDMA: {info}"
    for cmd in ("ibv_devinfo", "ibv_devices", "ib_write_bw"):
        r = target.sh(cmd, timeout=30)
        out = r.stdout + r.stderr
        # 0 = claims success, 124 = hung until timeout, 129-192 = killed by a signal (a crash)
        assert r.rc != 0 and r.rc != 124 and not 128 < r.rc <= 192, \
            f"{cmd} exited {r.rc} without a device: {out.strip()[:300]}"
        assert NO_DEVICE.search(out), f"{cmd} did not say 'no device': {out.strip()[:300]}"


@pytest.mark.fabric
def test_port_active(target):
    """A device is listed with an ACTIVE port (sysfs, machine-readable)."""
    r = target.sh("for f in /sys/class/infiniband/*/ports/*/state; do echo \"$f $(cat $f)\"; done")
    states = dict(ln.split(" ", 1) for ln in r.stdout.splitlines() if ln.startswith("/sys/"))
    assert any("ACTIVE" in s for s in states.values()), f"no ACTIVE port: {states or r.stderr.strip()}"


@pytest.mark.fabric
def test_ib_write_bw_moves_data(target):
    """ib_write_bw loopback (server + client in the container) reports a bandwidth > 0."""
    r = target.sh("dev=$(ls /sys/class/infiniband | head -1); "
                  "ib_write_bw -d $dev -F -D 2 >/tmp/ibsrv.log 2>&1 & sleep 1; "
                  "ib_write_bw -d $dev -F -D 2 localhost; rc=$?; wait; exit $rc", timeout=120)
    assert r.rc == 0, f"ib_write_bw loopback exited {r.rc}: {(r.stderr or r.stdout).strip()[-800:]}"
    rows = re.findall(r"(?m)^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", r.stdout)
    assert rows and float(rows[-1][3]) > 0, f"no bandwidth row: {r.stdout.strip()[-800:]}"
