"""InfiniBand userspace: libraries and the providers the manifest claims load, the tools are
there, UCX carries IB, and without a device everything says so cleanly.

Expectations come from the manifest's components.ib (kind, providers) and components.ucx."""

import re
import shlex

import pytest

from trainbase_conformance.fixtures import PROBE_DIR
from trainbase_conformance.transport_settings import defects, parse_config_file, parse_env

TOOLS = ("ibv_devinfo", "ibv_devices", "ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_write_lat", "ibstat", "rdma")
NO_DEVICE = re.compile(
    r"(?i)(no (ib|rdma|infiniband)[ /\w]* devices? found|failed to get ib devices list|"
    r"unable to find the infiniband/roce device|did not detect devices|no such device)"
)


def _verbs(target) -> dict:
    if "verbs" not in target.cache:
        providers = " ".join(target.components["ib"].get("providers") or [])
        target.cache["verbs"] = target.json_probe(f"{target.python} {PROBE_DIR}/verbs.py {providers}")
    return target.cache["verbs"]


@pytest.mark.static
@pytest.mark.evidence("load")
def test_verbs_libraries_load(target):
    """libibverbs and librdmacm load (dlopen)."""
    libs = _verbs(target)["libs"]
    bad = {k: v for k, v in libs.items() if v != "loaded"}
    assert not bad, f"RDMA libraries do not load: {bad}"


@pytest.mark.static
@pytest.mark.evidence("load")
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
@pytest.mark.evidence("load")
def test_mlx5_direct_verbs(target):
    """libmlx5 (mlx5 direct verbs, what UCX's accelerated transports use) loads by its soname
    through the linker cache and exports mlx5dv_query_device."""
    if "mlx5" not in (target.components["ib"].get("providers") or []):
        pytest.skip("n/a: the manifest claims no mlx5 provider")
    r = target.sh(
        f"{target.python} -c "
        + shlex.quote(
            "import ctypes; l = ctypes.CDLL('libmlx5.so.1', mode=ctypes.RTLD_GLOBAL); l.mlx5dv_query_device; print('ok')"
        )
    )
    assert r.rc == 0 and r.stdout.strip() == "ok", (
        f"libmlx5.so.1 does not load: {(r.stderr or r.stdout).strip()[-600:]}"
    )


# Each tool runs: its usage/version output, and no loader error. (`--help`/`-V` exit codes
# vary by tool; a missing library is exit 127 with "error while loading shared libraries".)
TOOL_RUNS = {
    "ibv_devinfo": "ibv_devinfo --help",
    "ibv_devices": "ibv_devices --help",
    "ib_write_bw": "ib_write_bw --version",
    "ib_read_bw": "ib_read_bw --version",
    "ib_send_bw": "ib_send_bw --version",
    "ib_write_lat": "ib_write_lat --version",
    "ibstat": "ibstat -V",
    "rdma": "rdma -V",
}
LOADER_ERROR = re.compile(r"error while loading shared libraries|cannot open shared object|symbol lookup error")


@pytest.mark.static
@pytest.mark.evidence("run")
def test_rdma_tools_run(target):
    """ibv_devinfo, perftest and diagnostics are on PATH and start: every shared library they
    need resolves, and each prints its usage or version."""
    target.require("ib")  # an expectations file without 'ib', on an image without libibverbs: skipped
    problems = []
    for tool, cmd in TOOL_RUNS.items():
        r = target.sh(f"command -v {tool} >/dev/null || exit 127; {cmd}", timeout=30)
        out = (r.stdout + r.stderr).strip()
        if r.rc in (124, 126, 127) or 128 < r.rc <= 192 or LOADER_ERROR.search(out):
            problems.append(f"{tool}: exit {r.rc}: {out[-200:] or 'not on PATH'}")
        elif not out:
            problems.append(f"{tool}: `{cmd}` printed nothing (exit {r.rc})")
    assert not problems, "RDMA tools that do not run:\n" + "\n".join(problems)


@pytest.mark.static
@pytest.mark.evidence("run")
def test_ucx_version(target):
    """ucx_info reports the UCX version the manifest names."""
    want = target.components["ucx"]["version"]
    r = target.sh("ucx_info -v")
    m = re.search(r"(?m)^# Version (\S+)", r.stdout)
    assert m, f"ucx_info -v printed no version (rc {r.rc}): {(r.stdout or r.stderr)[:300]}"
    assert m.group(1) == want, f"UCX {m.group(1)} in the image, manifest says {want}"


def ucx_build_modules(target, ucx_info: str = "ucx_info") -> dict[str, list[str]]:
    """What the UCX build says it has: {"uct": [...], "uct_ib": [...], ...} from `ucx_info -b`."""
    r = target.sh(f"{ucx_info} -b")
    assert r.rc == 0, f"{ucx_info} -b exited {r.rc}: {r.stderr.strip()}"
    defines = dict(re.findall(r"(?m)^#define\s+(\w+)\s+(.*?)\s*$", r.stdout))
    return {
        k[: -len("_MODULES")]: [m for m in v.strip('"').split(":") if m]
        for k, v in defines.items()
        if k.endswith("_MODULES")
    }


def expected_ucx_modules(target, built: dict[str, list[str]] | None = None) -> set[str]:
    """The UCT transport modules that must load: the ones the manifest implies (an image with
    an InfiniBand userspace needs UCX's `ib` and `rdmacm` transports) plus every uct module the
    build itself declares (a declared module that does not load is a broken image)."""
    want = {"ib", "rdmacm"} if target.components.get("ib") else set()
    return want | set((built or {}).get("uct", []))


def parse_ucx_module_log(text: str) -> tuple[dict[str, str], list[str], str | None]:
    """UCX's module loader log (UCX_MODULE_LOG_LEVEL=info): module -> file it loaded, the lines
    that report a failed load, and the libucs that did the loading."""
    loaded: dict[str, str] = {}
    failures = []
    libucs = None
    for ln in text.splitlines():
        m = re.search(r"ucs library path: (\S+)", ln)
        if m:
            libucs = libucs or m.group(1)
            continue
        m = re.search(r"\bloaded (\S+/lib(?:uct|ucm|ucs|ucp|ucx)_(\w+?)\.so\S*)", ln)
        if m:
            loaded[m.group(2)] = m.group(1)
            continue
        if "module.c" in ln and re.search(r"(?i)(failed|cannot|undefined symbol|no such file)", ln):
            failures.append(ln.split("UCX", 1)[-1].strip())
    return loaded, failures, libucs


UCX_MODULE_LOG = "UCX_MODULE_LOG_LEVEL=info UCX_LOG_LEVEL=info"


@pytest.mark.static
@pytest.mark.evidence("load")
def test_ucx_ib_transports_load(target):
    """The image's UCX loads its InfiniBand transports: `ucx_info -d` with UCX's own module log
    shows every transport module the manifest implies and the build declares (ib, rdmacm, ...)
    dlopened with all its dependencies. The build configuration alone (`ucx_info -b`) still
    says "ib" in an image whose libuct_ib.so was deleted: on a cluster that image runs over TCP
    without a word."""
    target.components["ucx"]  # an image that declares no UCX (expectations file): skipped, saying so
    built = ucx_build_modules(target)
    want = expected_ucx_modules(target, built)
    r = target.sh(f"{UCX_MODULE_LOG} ucx_info -d", timeout=60)
    loaded, failures, libucs = parse_ucx_module_log(r.stdout + r.stderr)
    missing = sorted(want - set(loaded))
    assert not missing, (
        f"UCX ({libucs or 'ucx_info'}) did not load transport modules {missing} "
        f"(build declares {built.get('uct')}, loaded {sorted(loaded)}); "
        f"loader said: {failures[:5] or (r.stdout + r.stderr).strip()[-400:]}"
    )
    assert not failures, f"UCX module loads that failed: {failures[:5]}"


# libfabric's RDMA providers, which Intel MPI uses across nodes over InfiniBand (mlx through
# UCX, verbs directly); tcp alone is what it fell back to, without a word, when they were gone
LIBFABRIC_RDMA_PROVIDERS = {"verbs", "mlx"}


@pytest.mark.static
@pytest.mark.evidence("load")
def test_intel_mpi_libfabric_loads_its_rdma_providers(target):
    """The image's own `fi_info -l` (libfabric dlopens and registers every provider it finds)
    lists the RDMA providers, with the image's ENV and without it (FI_PROVIDER_PATH unset:
    bare ch-run, Apptainer --cleanenv)."""
    mpi = target.need_mpi()
    if mpi.kind != "intelmpi":
        pytest.skip(f"{target.name}'s MPI is {mpi.kind}: libfabric is Intel MPI's transport layer")
    for how, prefix in (("with the image's ENV", ""), ("without FI_PROVIDER_PATH", "env -u FI_PROVIDER_PATH ")):
        r = target.sh(f"{prefix}fi_info -l")
        assert r.rc == 0, f"fi_info -l {how} exited {r.rc}: {(r.stderr or r.stdout).strip()[-600:]}"
        listed = {ln[:-1] for ln in r.stdout.splitlines() if ln.endswith(":") and not ln.startswith(" ")}
        missing = LIBFABRIC_RDMA_PROVIDERS - listed
        assert not missing, (
            f"libfabric {how} does not load {sorted(missing)} (it lists {sorted(listed)}): Intel "
            f"MPI would run across nodes over TCP (FI_PROVIDER_PATH, /usr/local/lib/libfabric)"
        )


@pytest.mark.cpu
@pytest.mark.evidence("run")
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
        assert r.rc != 0 and r.rc != 124 and not 128 < r.rc <= 192, (
            f"{cmd} exited {r.rc} without a device: {out.strip()[:300]}"
        )
        assert NO_DEVICE.search(out), f"{cmd} did not say 'no device': {out.strip()[:300]}"


@pytest.mark.fabric
@pytest.mark.evidence("load")
def test_port_active(target):
    """The image's own verbs stack opens a device with an ACTIVE port: `ibv_devinfo` (the
    image's libibverbs and provider) opens each device through its /dev/infiniband node in the
    container. Sysfs alone would be the host's view: any container reads it, with or without
    the device nodes or a provider that loads, so a job could still find no usable device."""
    r = target.sh("ibv_devinfo", timeout=60)
    hcas = re.findall(r"(?m)^hca_id:\s*(\S+)", r.stdout)
    assert r.rc == 0 and hcas, (
        f"the image's ibv_devinfo opened no device (exit {r.rc}): {(r.stderr or r.stdout).strip()[-600:]}"
    )
    ports = re.findall(r"(?m)^\s*port:\s*(\d+)\s*\n\s*state:\s*(\S+)", r.stdout)
    assert any(state == "PORT_ACTIVE" for _, state in ports), f"no ACTIVE port on {hcas}: ports {ports}"


@pytest.mark.fabric
@pytest.mark.evidence("run")
def test_ib_write_bw_moves_data(target):
    """ib_write_bw loopback (server + client in the container) reports a bandwidth > 0."""
    r = target.sh(
        "dev=$(ls /sys/class/infiniband | head -1); "
        "ib_write_bw -d $dev -F -D 2 >/tmp/ibsrv.log 2>&1 & sleep 1; "
        "ib_write_bw -d $dev -F -D 2 localhost; rc=$?; wait; exit $rc",
        timeout=120,
    )
    assert r.rc == 0, f"ib_write_bw loopback exited {r.rc}: {(r.stderr or r.stdout).strip()[-800:]}"
    rows = re.findall(r"(?m)^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", r.stdout)
    assert rows and float(rows[-1][3]) > 0, f"no bandwidth row: {r.stdout.strip()[-800:]}"


# Where NCCL, Open MPI and UCX read settings from, besides the environment: NCCL's files, the MCA
# parameter files of any Open MPI (source prefix, wheel, HPC-X) and UCX's config file.
SETTINGS_FILES = (
    "for f in /etc/nccl.conf /root/.nccl.conf $(find /etc /opt /usr/local /root -xdev "
    "\\( -name openmpi-mca-params.conf -o -name mca-params.conf -o -name ucx.conf \\) 2>/dev/null); "
    'do [ -f "$f" ] && printf \'\\n==> %s\\n\' "$f" && cat "$f"; done; true'
)


@pytest.mark.static
@pytest.mark.evidence("content")
def test_no_baked_setting_switches_the_fabric_off(target):
    """The image bakes in no setting that keeps NCCL, UCX, Open MPI or Intel MPI off
    InfiniBand/RoCE or pins them to one cluster's device names (NCCL_IB_DISABLE=1, UCX_TLS=tcp,
    pml=ob1, FI_PROVIDER=tcp, NCCL_IB_HCA=mlx5_0, ...): in the image's ENV, in what a login shell
    adds, or in nccl.conf / mca-params.conf / ucx.conf. Nothing fails without a fabric, so only
    this finds them before the cluster runs every job over TCP."""
    env = (target.inspect.get("Config") or {}).get("Env") or []
    settings = parse_env("\n".join(env), "image ENV")
    plain = {s.name: s.value for s in parse_env(target.sh("env -0").stdout, "")}
    settings += [
        s
        for s in parse_env(target.login("env -0").stdout, "login shell (/etc/profile.d)")
        if plain.get(s.name) != s.value
    ]
    files = target.sh(SETTINGS_FILES).stdout
    for chunk in files.split("\n==> ")[1:]:
        path, _, text = chunk.partition("\n")
        settings += parse_config_file(path.strip(), text)
    found = defects(settings)
    assert not found, "settings baked into the image that take the fabric away:\n" + "\n".join(found)
