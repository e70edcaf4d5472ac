"""MPI: the launcher a user types works, is the MPI the manifest names, and computes.

Expectations come from the manifest's components.mpi (kind, version, prefix)."""

import re
from collections.abc import Iterable

import pytest

from trainbase_conformance.fixtures import PROBE_DIR, tbconf_lines

# Lines that must never appear on a healthy run's stderr (CMA without SYS_PTRACE, transport
# fallbacks, Open MPI's help-file banners).
WARNING = re.compile(r"(?i)(warn|read -1|errno|error|failed|not available|could not|unable|deprecated|-{20,})")


def _compile_allreduce(target) -> str:
    """Compile the C allreduce probe with the image's mpicc, once per image."""
    if "allreduce" not in target.cache:
        r = target.sh(f"cd {PROBE_DIR} && mpicc -O2 -o allreduce allreduce.c")
        target.cache["allreduce"] = (r.rc, (r.stderr or r.stdout).strip())
    rc, err = target.cache["allreduce"]
    assert rc == 0, f"mpicc could not build a 4-line MPI program: {err[-1500:]}"
    return f"{PROBE_DIR}/allreduce"


def _check_ranks(ranks: list[dict], n: int, what: str) -> None:
    assert sorted(r["rank"] for r in ranks) == list(range(n)), f"{what}: ranks seen {ranks}"
    assert all(r["size"] == n for r in ranks), f"{what}: world sizes {[r['size'] for r in ranks]}"
    assert all(r["ok"] for r in ranks), f"{what}: wrong values on some rank: {ranks}"


@pytest.mark.static
@pytest.mark.parametrize("shell", ["non-login", "login"])
@pytest.mark.evidence("run")
@pytest.mark.trainbase_contract("tb-doctor")
def test_launcher_runs_from_path(target, shell):
    """The image's own doctor check mpi.launcher (written once, shipped in the image), run from
    `sh -c` and from `bash -lc`: every launcher of the manifest's MPI resolves under its prefix,
    runs, and reports the manifest's version (Azure ML #209 `mpirun: command not found`, #133
    an image named openmpi4.1.0 that held 3.1.2)."""
    target.need_mpi()
    c = target.doctor_check("mpi.launcher", login=shell == "login")
    assert c["status"] == "ok", f"in a {shell} shell: {c['summary']}"
    assert c["facts"]["version"] == target.components["mpi"]["version"], c["facts"]


# What each launcher prints for --version, by MPI kind (group 1: the version). The suite's own
# reading, independent of the image's tb-doctor: an old image is not judged by its old doctor.
LAUNCHER_VERSION = {
    "openmpi": r"\((?:Open MPI|OpenRTE)\)\s+(\d[\w.]*)",  # mpirun (Open MPI) 4.1.4
    "intelmpi": r"Intel\(R\) MPI Library.*?Version\s+(\d[\w.]*)",  # ..., Version 2021.18 Build 2025...
}


@pytest.mark.static
@pytest.mark.parametrize("shell", ["non-login", "login"])
@pytest.mark.evidence("run")
def test_launchers_on_path_are_the_manifests_mpi(target, shell):
    """Beside the doctor's mpi.launcher, asked of the shell itself: in `sh -c` and in `bash -lc`
    every launcher of the manifest's MPI resolves by name under the manifest's prefix and its
    `--version` names the manifest's version (Intel MPI's launcher prints the release without
    its update digit: 2021.18 for 2021.18.1). The shell contract needs no declaration: on an
    image whose expectations file declares no MPI, each launcher found on PATH must resolve and
    name an MPI version all the same (the checks that compare with a declared MPI fail there,
    saying what to declare); with no launcher and none declared, skipped, saying so."""
    mpi = target.mpi if target.mpi or target.foreign else target.need_mpi()  # a manifest without an MPI: failed
    run = target.login if shell == "login" else target.sh
    launchers = mpi.launchers if mpi else tuple(n for n in ("mpirun", "mpiexec") if run(f"command -v {n}").rc == 0)
    if not launchers:
        target.need_mpi()  # no launcher and none declared: skipped, saying what to declare
    for name in launchers:
        r = run(f'p=$(command -v {name}) && readlink -f "$p" && "$p" --version 2>&1')
        out = (r.stdout + r.stderr).strip()
        assert r.rc == 0, f"in a {shell} shell, `{name}` does not resolve or run (exit {r.rc}): {out[-500:]}"
        real, _, said = out.partition("\n")
        assert mpi is None or not mpi.prefix or real.startswith(mpi.prefix.rstrip("/") + "/"), (
            f"in a {shell} shell, `{name}` is {real}, not under the manifest's MPI prefix {mpi.prefix}"
        )
        m = re.search(LAUNCHER_VERSION[mpi.kind] if mpi else "|".join(LAUNCHER_VERSION.values()), said, re.S)
        assert m, f"in a {shell} shell, `{name} --version` names no version: {said[-500:]}"
        if mpi is None:
            continue
        version = m.group(1)
        same = version == mpi.version or (mpi.kind == "intelmpi" and mpi.version.startswith(version + "."))
        assert same, (
            f"in a {shell} shell, `{name}` ({real}) reports {version}, the manifest says {mpi.kind} {mpi.version}"
        )


@pytest.mark.static
@pytest.mark.evidence("load")
def test_ompi_info_version(target):
    """Open MPI: ompi_info's machine-readable version equals the manifest."""
    mpi = target.need_mpi()
    if mpi.kind != "openmpi":
        pytest.skip(f"n/a: {mpi.kind} (Open MPI only)")
    r = target.sh("ompi_info --parsable --version ompi full 2>/dev/null || ompi_info --parsable")
    versions = dict(
        ln.split(":", 3)[2:4] for ln in r.stdout.splitlines() if ln.startswith("ompi:version:") and ln.count(":") >= 3
    )
    assert versions.get("full") == mpi.version, f"ompi_info says {versions or r.stdout[:200]}, manifest {mpi.version}"


@pytest.mark.static
@pytest.mark.evidence("load")
def test_ompi_ucx_and_verbs_components_load(target):
    """Open MPI opens its RDMA components without a load error: pml ucx and osc ucx, and on 4.x
    btl openib (verbs). ompi_info dlopens every component; with show_load_errors a component
    whose library (libucp, libibverbs, ...) is missing is named, not silently left out."""
    mpi = target.need_mpi()
    if mpi.kind != "openmpi":
        pytest.skip(f"n/a: {mpi.kind} (Open MPI only)")
    r = target.sh("OMPI_MCA_mca_base_component_show_load_errors=1 ompi_info --parsable")
    assert r.rc == 0, f"ompi_info --parsable exited {r.rc}: {r.stderr.strip()[-800:]}"
    comps: dict[str, set[str]] = {}
    for ln in r.stdout.splitlines():
        parts = ln.split(":")
        if len(parts) > 3 and parts[0] == "mca" and parts[3] == "version":
            comps.setdefault(parts[1], set()).add(parts[2])
    want = {("pml", "ucx"), ("osc", "ucx")} | ({("btl", "openib")} if mpi.major < 5 else set())
    missing = sorted(f"{f} {c}" for f, c in want if c not in comps.get(f, set()))
    errors = [
        ln.strip()
        for ln in (r.stderr + r.stdout).splitlines()
        if re.search(r"(?i)unable to open|cannot open shared object|undefined symbol|component was not found", ln)
    ]
    assert not missing, f"Open MPI components that did not open: {missing}; load errors: {errors[:6]}"
    assert not errors, "component load errors: " + " | ".join(errors[:6])


# Open MPI 4.1's component for each library it can take from the distro (configure's
# --with-hwloc/--with-libevent=external, --with-pmix=DIR) and the one for the copy its tarball
# embeds: framework, the distro's component (a prefix for PMIx: ext3x for PMIx 3 and newer), the
# embedded one.
OMPI_SYSTEM_LIB_COMPONENTS = {
    "hwloc": ("hwloc", "external", "hwloc201"),
    "libevent": ("event", "external", "libevent2022"),
    "pmix": ("pmix", "ext", "pmix3x"),
}


def ompi_components(text: str) -> dict[str, set[str]]:
    """framework -> its components, from `ompi_info --parsable` (its mca:FW:COMP:version lines)."""
    comps: dict[str, set[str]] = {}
    for ln in text.splitlines():
        parts = ln.split(":")
        if len(parts) > 3 and parts[0] == "mca" and parts[3] == "version":
            comps.setdefault(parts[1], set()).add(parts[2])
    return comps


@pytest.mark.static
@pytest.mark.evidence("load")
def test_ompi_uses_the_distro_libraries_the_manifest_names(target):
    """An Open MPI built against the distro's hwloc, libevent and PMIx (components.mpi.system_libs,
    as Debian builds its own) runs on them: ompi_info opens the external component of each and
    not the embedded copy, so Slurm's srun --mpi=pmix meets the PMIx the distro's Slurm speaks."""
    mpi = target.need_mpi()
    declared = target.components["mpi"].get("system_libs") or []
    if mpi.kind != "openmpi" or not declared:
        pytest.skip(f"n/a: {target.name}'s MPI compiles its own hwloc, libevent and PMIx (no system_libs)")
    r = target.sh("OMPI_MCA_mca_base_component_show_load_errors=1 ompi_info --parsable")
    assert r.rc == 0, f"ompi_info --parsable exited {r.rc}: {r.stderr.strip()[-800:]}"
    comps = ompi_components(r.stdout)
    wrong = []
    for lib in declared:
        framework, external, embedded = OMPI_SYSTEM_LIB_COMPONENTS[lib]
        have = comps.get(framework, set())
        if not any(c.startswith(external) for c in have) or embedded in have:
            wrong.append(f"{lib}: {framework} components {sorted(have)} (want {external}*, not {embedded})")
    assert not wrong, (
        f"the manifest says Open MPI uses the distro's {', '.join(declared)}, but ompi_info opens: " + "; ".join(wrong)
    )


def _ompi_ucx(target) -> dict:
    """The UCX this Open MPI really loads: libmpi (found through ompi_info's own linkage, so
    relocated wheels work), then mca_pml_ucx.so next to it (source builds) or libmpi itself
    (static components), then their libucp/libuct; its version and its transport modules."""
    if "ompi_ucx" not in target.cache:
        r = target.sh(
            "set -e; libmpi=$(ldd \"$(command -v ompi_info)\" | sed -n 's/^[[:space:]]*libmpi\\.so[^ ]* => \\([^ ]*\\) .*/\\1/p'); "
            'test -n "$libmpi"; pml=$(dirname "$(readlink -f "$libmpi")")/openmpi/mca_pml_ucx.so; '
            '[ -e "$pml" ] || pml=$libmpi; '
            "ldd \"$pml\" | sed -n 's/^[[:space:]]*\\(libu[ct][pt]\\.so[^ ]*\\) => \\([^ ]*\\) .*/\\1 \\2/p'"
        )
        assert r.rc == 0, f"could not find the libmpi/pml_ucx of this Open MPI: {r.stderr.strip()}"
        libs = dict(ln.split() for ln in r.stdout.splitlines() if ln.strip())
        ucp = next((v for k, v in libs.items() if k.startswith("libucp")), None)
        uct = next((v for k, v in libs.items() if k.startswith("libuct")), None)
        assert ucp and uct, f"this Open MPI's pml ucx links no libucp/libuct: {libs}"
        v = target.sh(
            f'{target.python} -c \'import ctypes; l = ctypes.CDLL("{ucp}"); '
            "l.ucp_get_version_string.restype = ctypes.c_char_p; print(l.ucp_get_version_string().decode())'"
        )
        target.cache["ompi_ucx"] = {"libucp": ucp, "version": v.stdout.strip() or v.stderr.strip()}
    return target.cache["ompi_ucx"]


@pytest.mark.static
@pytest.mark.evidence("load")
def test_ompi_ucx_is_manifest_ucx(target):
    """The UCX that Open MPI's pml ucx really loads is the one the manifest names for the MPI
    (components.mpi.ucx: the wheel's own copy where the MPI bundles one, else the image's)."""
    mpi = target.need_mpi()
    if mpi.kind != "openmpi":
        pytest.skip(f"n/a: {mpi.kind} (Open MPI only)")
    want = (target.components["mpi"].get("ucx") or target.components["ucx"])["version"]
    ucx = _ompi_ucx(target)
    assert ucx["version"] == want, (
        f"Open MPI runs on UCX {ucx['version']} ({ucx['libucp']}), the manifest says UCX {want}"
    )


@pytest.mark.static
@pytest.mark.evidence("load")
def test_mpi4py_linked_to_image_mpi(target):
    """mpi4py reports the image's MPI and version (MPI_Get_library_version)."""
    mpi = target.need_mpi()
    r = target.sh(f"{target.python} -c 'from mpi4py import MPI; print(MPI.Get_library_version())'")
    assert r.rc == 0, f"import mpi4py failed: {r.stderr.strip()[-800:]}"
    m = re.search(mpi.library_regex, r.stdout)
    assert m, f"mpi4py is not linked to {mpi.kind}: {r.stdout.strip()[:300]}"
    assert m.group(1) == mpi.version, f"mpi4py's MPI is {mpi.kind} {m.group(1)}, manifest says {mpi.version}"


@pytest.mark.cpu
@pytest.mark.evidence("run")
def test_root_without_flags(target):
    """As root, a 1-rank job starts with no --allow-run-as-root style flags."""
    mpi = target.need_mpi()
    assert target.sh("id -u").stdout.strip() == "0", "containers of this image do not run as root by default"
    launcher = mpi.launchers[0]
    r = target.sh(f"{launcher} -n 1 true", timeout=60)
    assert r.rc == 0, f"`{launcher} -n 1 true` as root exited {r.rc}: {r.stderr.strip()[-800:]}"


@pytest.mark.cpu
@pytest.mark.evidence("run")
def test_mpicc_allreduce_4_ranks(target):
    """A C program built with the image's mpicc computes a value-checked 4-rank allreduce."""
    mpi = target.need_mpi()
    exe = _compile_allreduce(target)
    r = target.sh(f"{mpi.local(4)} {exe}", timeout=120)
    assert r.rc == 0, f"4-rank run exited {r.rc}: {(r.stderr or r.stdout).strip()[-1500:]}"
    _check_ranks(tbconf_lines(r.stdout), 4, "mpicc allreduce")


@pytest.mark.cpu
@pytest.mark.evidence("run")
def test_mpi4py_allreduce_4_ranks(target):
    """The image's mpi4py computes a value-checked 4-rank allreduce on the image's MPI."""
    mpi = target.need_mpi()
    r = target.sh(f"{mpi.local(4)} {target.python} {PROBE_DIR}/allreduce_mpi4py.py", timeout=120)
    assert r.rc == 0, f"4-rank mpi4py run exited {r.rc}: {(r.stderr or r.stdout).strip()[-1500:]}"
    ranks = tbconf_lines(r.stdout)
    _check_ranks(ranks, 4, "mpi4py allreduce")
    lib = ranks[0]["library"]
    m = re.search(mpi.library_regex, lib)
    assert m and m.group(1) == mpi.version, f"ranks ran on `{lib}`, manifest says {mpi.kind} {mpi.version}"


@pytest.mark.cpu
@pytest.mark.evidence("run")
def test_shared_memory_without_warnings(target):
    """4 ranks in one default container (no SYS_PTRACE, no tuning flags): 8 MiB allreduce
    and a sendrecv ring through shared memory give right values and a clean stderr."""
    mpi = target.need_mpi()
    r = target.sh(f"{mpi.local(4)} {target.python} {PROBE_DIR}/allreduce_mpi4py.py", timeout=120)
    assert r.rc == 0, f"run exited {r.rc}: {(r.stderr or r.stdout).strip()[-1500:]}"
    _check_ranks(tbconf_lines(r.stdout), 4, "shared-memory allreduce")
    noise = [ln for ln in r.stderr.splitlines() if WARNING.search(ln)]
    assert not noise, "stderr of a default shared-memory run:\n" + "\n".join(noise[:20])


# UCX times everything from the CPU's timer frequency, which on aarch64 it reads from the
# generic timer (cntfrq_el0); under qemu 10 (what runs PyTorch's aarch64 wheel on this host's
# kernel) UCX 1.13 and 1.20 then refuse to start: "UCX_KEEPALIVE_INTERVAL value must be greater
# than 0" (measured; qemu 7.2 passed, but cannot import torch). A native arm64 runner runs them.
UCX_UNDER_QEMU = (
    "UCX derives its clock from the aarch64 generic timer, which qemu 10 emulates so that UCX "
    "refuses to start (UCX_KEEPALIVE_INTERVAL value must be greater than 0)"
)


def _pml_ucx_job(target):
    """One 2-rank `--mca pml ucx` run of the C allreduce, with UCX's module log on (its lines go
    to stdout/stderr beside the ranks' TBCONF lines), shared by the checks below."""
    from .test_ib import UCX_MODULE_LOG

    mpi = target.need_mpi()
    if mpi.kind != "openmpi":
        pytest.skip(f"n/a: {mpi.kind} (Open MPI only)")
    if "pml_ucx_job" not in target.cache:
        exe = _compile_allreduce(target)
        # Open MPI's UCX PML selects itself only on RDMA devices (its default pml_ucx_tls/devices),
        # which this host lacks: the job lets UCX use any transport, to prove the PML computes
        any_transport = "--mca pml_ucx_tls any --mca pml_ucx_devices any"
        target.cache["pml_ucx_job"] = target.sh(
            f"{UCX_MODULE_LOG} {mpi.local(2)} --mca pml ucx {any_transport} {exe}", timeout=120
        )
    r = target.cache["pml_ucx_job"]
    assert r.rc == 0, f"--mca pml ucx exited {r.rc}: {(r.stderr or r.stdout).strip()[-1500:]}"
    return r


@pytest.mark.cpu
@pytest.mark.evidence("run")
@pytest.mark.native_only(UCX_UNDER_QEMU)
def test_ompi_ucx_pml_runs(target):
    """Open MPI: the UCX PML is selectable and computes in a container without RDMA devices."""
    target.components["ucx"]  # an image that declares no UCX (expectations file): skipped, saying so
    _check_ranks(tbconf_lines(_pml_ucx_job(target).stdout), 2, "pml ucx allreduce")


@pytest.mark.cpu
@pytest.mark.evidence("load")
@pytest.mark.native_only(UCX_UNDER_QEMU)
def test_ompi_ucx_loads_ib_transports(target):
    """Open MPI's pml ucx, in a real 2-rank job, loads UCX's InfiniBand transports: UCX's own
    module log (UCX_MODULE_LOG_LEVEL=info) in every rank names ib and rdmacm -- and every other
    libuct_* module shipped beside them -- as loaded from the UCX the manifest names. Open MPI 5
    has no verbs BTL: this is its only RDMA path, and an image without it runs over TCP."""
    from .test_ib import expected_ucx_modules, parse_ucx_module_log

    target.components["ucx"]
    r = _pml_ucx_job(target)
    loaded, failures, libucs = parse_ucx_module_log(r.stdout + r.stderr)
    assert libucs, f"UCX printed no module log (is pml ucx really used?): {(r.stdout + r.stderr)[-600:]}"
    shipped = target.sh(f'ls "$(dirname "$(readlink -f {libucs})")/ucx"').stdout.split()
    want = expected_ucx_modules(target) | {m.group(1) for f in shipped if (m := re.match(r"libuct_(\w+?)\.so", f))}
    missing = sorted(want - set(loaded))
    assert not missing, (
        f"the UCX Open MPI runs on ({libucs}) did not load {missing} (loaded {sorted(loaded)}); "
        f"loader said: {failures[:5]}"
    )
    assert not failures, f"UCX module loads that failed under Open MPI: {failures[:5]}"


# --------------------------------------------------------------------------- CUDA-aware MPI (issue 56)
# Whether MPI calls take CUDA device buffers is a build fact of the MPI (ompi_info) and of the UCX
# it runs on (its libuct_cuda module: cuda_copy, cuda_ipc; libuct_cuda_gdrcopy: gdr_copy). The
# manifest declares both (components.mpi.cuda_aware, components.{mpi.ucx,ucx}.cuda_transports); an
# image that claims CUDA buffers and cannot take them crashes the first job that sends one, and one
# that can but says not makes users stage through host memory for nothing.
OMPI_CUDA_PARAMS = ("mpi_built_with_cuda_support", "opal_built_with_cuda_support")  # 4.1, 5.0 (+ synonym)
UCX_CUDA_MODULE_TRANSPORTS = {"cuda": ("cuda_copy", "cuda_ipc"), "cuda_gdrcopy": ("gdr_copy",)}
UCX_CUDA_TRANSPORTS = ("cuda_copy", "cuda_ipc", "gdr_copy")


def ompi_built_with_cuda(parsable: str) -> bool | None:
    """`ompi_info --parsable --all`: Open MPI 4.1 prints
    ``mca:mpi:base:param:mpi_built_with_cuda_support:value:true``, 5.0
    ``mca:opal:base:param:opal_built_with_cuda_support:value:false``; None when neither is there."""
    for ln in parsable.splitlines():
        parts = ln.strip().split(":")
        if (
            len(parts) >= 7
            and parts[0] == "mca"
            and parts[3] == "param"
            and parts[4] in OMPI_CUDA_PARAMS
            and parts[5] == "value"
        ):
            return parts[6] == "true"
    return None


def ucx_cuda_transports_built(build_info: str) -> set[str]:
    """`ucx_info -b`: the CUDA transports compiled in, from its module lists
    (``#define uct_MODULES ":cuda:ib:rdmacm:cma"``, ``#define uct_cuda_MODULES ":gdrcopy"``).
    Unlike ``-d``, this does not need a GPU: without one UCX lists no cuda transport at all."""
    modules = dict(re.findall(r"^#define\s+(uct_MODULES|uct_cuda_MODULES)\s+\"([^\"]*)\"", build_info, re.M))
    uct = set(modules.get("uct_MODULES", "").split(":"))
    found = set(UCX_CUDA_MODULE_TRANSPORTS["cuda"]) if "cuda" in uct else set()
    if "cuda" in uct and "gdrcopy" in modules.get("uct_cuda_MODULES", "").split(":"):
        found |= set(UCX_CUDA_MODULE_TRANSPORTS["cuda_gdrcopy"])
    return found


def ucx_cuda_transports_listed(devices: str) -> set[str]:
    """`ucx_info -d`: the CUDA transports UCX opened (``#      Transport: cuda_copy``); only
    where the driver sees a GPU."""
    return {t for t in re.findall(r"^#\s+Transport:\s+(\S+)", devices, re.M) if t in UCX_CUDA_TRANSPORTS}


def ucx_cuda_transports_in_modules(files: list[str]) -> set[str]:
    """The CUDA transports of a UCX module folder's files (``libuct_cuda.so.0``,
    ``libuct_cuda_gdrcopy.so.0``): for a UCX without its ucx_info, such as a wheel's own copy."""
    found: set[str] = set()
    for f in files:
        m = re.match(r"libuct_(cuda(?:_gdrcopy)?)\.so", f.rsplit("/", 1)[-1])
        if m:
            found |= set(UCX_CUDA_MODULE_TRANSPORTS[m.group(1)])
    return found


def cuda_aware_problems(what: str, claimed: bool, built: bool) -> list[str]:
    """The manifest's CUDA-aware claim against the MPI's build flag, both named."""
    if claimed == built:
        return []
    return [
        f"{what}: the manifest says CUDA-aware {str(claimed).lower()}, the image's MPI is built "
        f"{'with' if built else 'without'} CUDA support"
    ]


def cuda_transport_problems(what: str, claimed: Iterable[str], found: set[str]) -> list[str]:
    """The manifest's CUDA transports against a UCX's: a claimed one missing, or one not claimed."""
    want = set(claimed)
    problems = []
    if want - found:
        problems.append(
            f"{what}: the manifest claims {sorted(want - found)}, the image has only {sorted(found) or 'none'}"
        )
    if found - want:
        problems.append(
            f"{what}: the image has {sorted(found - want)}, which the manifest does not claim "
            f"(it says {sorted(want) or 'none'})"
        )
    return problems


def _declared(target, *path: str):
    """A manifest value under components, or a skip naming it (expectations files may omit it)."""
    node = target.components
    for key in path:
        if not isinstance(node, dict) or key not in node:
            pytest.skip(f"the manifest declares no components.{'.'.join(path)}: nothing to compare")
        node = node[key]
    return node


@pytest.mark.static
@pytest.mark.evidence("load")
def test_mpi_cuda_support_is_the_manifests(target):
    """Open MPI's own build flag (ompi_info's mpi_built_with_cuda_support) equals the manifest's
    components.mpi.cuda_aware: an MPI that claims CUDA buffers but was built without CUDA fails,
    and so does one built with it that the manifest calls host-only. Intel MPI has no such
    build flag (its GPU buffers are switched on at run time with I_MPI_OFFLOAD=1): skipped."""
    mpi = target.need_mpi()
    if mpi.kind != "openmpi":
        pytest.skip(f"n/a: {mpi.kind} has no build-time CUDA flag to read (Intel MPI: I_MPI_OFFLOAD=1 at run time)")
    claimed = _declared(target, "mpi", "cuda_aware")
    r = target.sh("ompi_info --parsable --all")
    assert r.rc == 0, f"ompi_info --parsable --all exited {r.rc}: {r.stderr.strip()[-800:]}"
    built = ompi_built_with_cuda(r.stdout)
    assert built is not None, "ompi_info --parsable --all names no mpi_built_with_cuda_support"
    problems = cuda_aware_problems(f"Open MPI {mpi.version} (mpi_built_with_cuda_support)", bool(claimed), built)
    assert not problems, "; ".join(problems)


@pytest.mark.static
@pytest.mark.evidence("load")
def test_ucx_cuda_transports_are_the_manifests(target):
    """The image's UCX (ucx_info) has exactly the CUDA transports the manifest's
    components.ucx.cuda_transports names: compiled-in ones from `ucx_info -b`'s module lists,
    and where a GPU is visible, those `ucx_info -d` opens."""
    claimed = _declared(target, "ucx", "cuda_transports")
    b, d = target.sh("ucx_info -b"), target.sh("ucx_info -d")
    assert b.rc == 0, f"ucx_info -b exited {b.rc}: {(b.stderr or b.stdout).strip()[-800:]}"
    found = ucx_cuda_transports_built(b.stdout) | ucx_cuda_transports_listed(d.stdout)
    problems = cuda_transport_problems("the image's UCX (ucx_info)", claimed, found)
    assert not problems, "; ".join(problems)


@pytest.mark.static
@pytest.mark.evidence("load")
def test_ompi_ucx_cuda_transports_are_the_manifests(target):
    """The UCX Open MPI's pml ucx really loads (a wheel's own copy or the image's) ships the
    CUDA transport modules components.mpi.ucx.cuda_transports names, and no others."""
    mpi = target.need_mpi()
    if mpi.kind != "openmpi":
        pytest.skip(f"n/a: {mpi.kind} (Open MPI only)")
    claimed = _declared(target, "mpi", "ucx", "cuda_transports")
    ucp = _ompi_ucx(target)["libucp"]
    r = target.sh(f'ls "$(dirname "$(readlink -f {ucp})")/ucx"')
    assert r.rc == 0, f"no UCX module folder beside {ucp}: {r.stderr.strip()}"
    found = ucx_cuda_transports_in_modules(r.stdout.split())
    problems = cuda_transport_problems(f"the UCX Open MPI loads ({ucp})", claimed, found)
    assert not problems, "; ".join(problems)


@pytest.mark.gpu
@pytest.mark.evidence("run")
def test_cuda_buffers_through_mpi4py(target):
    """Where the manifest says the MPI is CUDA-aware: 2 ranks send, all-reduce and broadcast
    8 MiB CUDA device buffers through mpi4py (__cuda_array_interface__, what CuPy and PyTorch
    tensors hand it), every element checked on the host afterwards."""
    mpi = target.need_mpi()
    if not _declared(target, "mpi", "cuda_aware"):
        pytest.skip(
            f"n/a: the manifest says {mpi.kind} {mpi.version} is not CUDA-aware "
            f"({target.components['mpi'].get('cuda_why', 'no reason given')})"
        )
    cudart = f"libcudart.so.{target.components['cuda']['version'].split('.')[0]}"
    r = target.sh(f"{mpi.local(2)} {target.python} {PROBE_DIR}/cuda_buffer_mpi4py.py {cudart}", timeout=180)
    ranks = tbconf_lines(r.stdout)
    assert r.rc == 0, f"2-rank CUDA-buffer run exited {r.rc}: {ranks or (r.stderr or r.stdout).strip()[-1500:]}"
    _check_ranks(ranks, 2, "CUDA buffers through mpi4py")
