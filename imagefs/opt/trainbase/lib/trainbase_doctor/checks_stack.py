"""The image's own stack as the job's process sees it: the MPI launcher, NCCL (the one the
linker loads, no second copy shadowing it, the network it picks), the launch contract."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from .core import FAIL, OK, SKIP, WARN, Node, Result, check
from .hardware import GPU_FLAGS, absent, cuda_driver, fabric, rdma

NCCL = "libnccl.so.2"
# Per MPI kind (the manifest's components.mpi.kind): the launchers users type, and how their
# --version names the version (Open MPI 4's mpiexec says "OpenRTE").
LAUNCHERS = {
    "openmpi": (("mpirun", "mpiexec"), r"\((?:Open MPI|OpenRTE)\)\s+(\d[\w.]*)"),
    "intelmpi": (("mpiexec", "mpirun"), r"Version\s+(\d[\w.]*)"),
}


def nccl_version_code(version: str) -> int:
    """NCCL_VERSION_CODE as ncclGetVersion returns it (the formula changed at 2.9)."""
    major, minor, patch = (int(x) for x in version.split(".")[:3])
    return major * 10000 + minor * 100 + patch if (major, minor) >= (2, 9) else major * 1000 + minor * 100 + patch


def nccl_version_name(code: int) -> str:
    return (
        f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
        if code >= 20900
        else f"{code // 1000}.{code % 1000 // 100}.{code % 100}"
    )


def _launcher_problem(node: Node, name: str, regex: str, prefix: str, want: str, facts: dict) -> str:
    """'' when ``name`` resolves on this PATH under the MPI's prefix and reports ``want``."""
    path = shutil.which(name, path=node.env.get("PATH", ""))
    if not path:
        return f"{name}: command not found on PATH={node.env.get('PATH', '')}"
    real = os.path.realpath(path)
    if prefix and not real.startswith(prefix.rstrip("/") + "/"):
        return f"{name} is {real}, not under the manifest's MPI prefix {prefix}: another MPI comes first on PATH"
    rc, out = node.run([path, "--version"], timeout=20)
    m = re.search(regex, out)
    facts[name] = path
    if rc != 0 or not m:
        return f"`{path} --version` exited {rc} without a version: {out.strip()[-300:]}"
    if facts.get("version") is None:  # the first launcher's; the others must report the same
        facts["version"] = m.group(1)
    if want and m.group(1) != want:
        return f"{path} reports {m.group(1)}, the manifest says {want}: the image's name and content disagree"
    return ""


def _not_the_images_path(node: Node, prefix: str, problems: list[str], facts: dict) -> Result:
    """The launcher is missing from PATH or another one comes first: often the container runs
    with the host's PATH (bare `ch-run DIR --`, enroot without the image's environment), where
    the image's python3 is not found either. Says so, and the runtime's fix (issue 22)."""
    py = node.component("python", "prefix") or ""
    bins = [f"{p.rstrip('/')}/bin" for p in (prefix, py) if p]
    entries = [e.rstrip("/") for e in node.env.get("PATH", "").split(":")]
    lacking = [b for b in bins if b not in entries]
    python3 = shutil.which("python3", path=node.env.get("PATH", ""))
    facts["python3"] = python3
    said = list(problems)
    if lacking:
        said.append(
            f"PATH lacks the image's {' and '.join(lacking)}: this process did not get the image's "
            "environment (Charliecloud and enroot keep the host's PATH)"
        )
    if py and (not python3 or not os.path.abspath(python3).startswith(py.rstrip("/") + "/")):
        said.append(f"python3 on this PATH is {python3 or 'missing'}, not the image's {py.rstrip('/')}/bin/python3")
    want = ":".join(bins) or "the image's MPI and Python bin directories"
    return Result(
        "",
        FAIL,
        "; ".join(said),
        facts=facts,
        hint=f"run with the image's environment, PATH={want}:...: Charliecloud `ch-run --set-env DIR -- ...` "
        "(applies the image's /ch/environment), enroot/pyxis set it from the image's /etc/environment "
        f"(check that it names {want}; `enroot start --env PATH` or pyxis `--container-env=PATH` bring the "
        "host's back), "
        f"Docker/Podman/Kubernetes from the image's ENV; or put {bins[0] if bins else 'the MPI bin dir'} "
        "first on PATH in the job, never a path only one image has",
    )


@check(
    "mpi.launcher",
    "the MPI launchers are on PATH, in login shells too, at the manifest's version",
    "mpirun",
    compare=("version",),
)
def mpi_launcher(node: Node) -> Result:
    kind, want = node.component("mpi", "kind"), str(node.component("mpi", "version") or "")
    if kind not in LAUNCHERS:
        return Result("", SKIP, f"skipped: the manifest names no MPI this doctor knows ({kind!r})")
    names, regex = LAUNCHERS[kind]
    prefix = node.component("mpi", "prefix") or ""
    facts: dict = {"version": None}
    hint = (
        f"put {prefix or 'the MPI'}/bin first on PATH in the image (ENV PATH and /etc/profile.d for `bash -l`, "
        "which Azure ML uses); never call the launcher by a path only one image has"
    )
    problems = [p for p in (_launcher_problem(node, n, regex, prefix, want, facts) for n in names) if p]
    if problems:
        found = [n for n in names if facts.get(n)]
        if len(found) < len(names) or any("not under the manifest's MPI prefix" in p for p in problems):
            return _not_the_images_path(node, prefix, problems, facts)
        return Result("", FAIL, "; ".join(problems), hint=hint, facts=facts)
    rc, out = node.run(["bash", "-lc", f"command -v {names[0]}"], timeout=20)
    facts["login_shell"] = out.strip() if rc == 0 else None
    if rc != 0:
        return Result(
            "",
            FAIL,
            f"{names[0]} is on this PATH but not in a login shell (`bash -l` resets PATH through /etc/profile)",
            hint=hint,
            facts=facts,
        )
    return Result(
        "",
        OK,
        f"{' and '.join(names)} under {prefix or '?'} ({kind} {facts['version']}), also in login shells",
        facts=facts,
    )


def _nccl_loaded(node: Node) -> dict:
    if "nccl" not in node.cache:
        try:
            lib = node.load(NCCL)
        except OSError as e:
            node.cache["nccl"] = {"error": str(e)}
        else:
            v = ctypes.c_int(0)
            rc = lib.ncclGetVersion(ctypes.byref(v))
            node.cache["nccl"] = (
                {"code": v.value, "path": node.loaded_from(NCCL)}
                if rc == 0
                else {"error": f"ncclGetVersion returned {rc}"}
            )
    return node.cache["nccl"]


@check("nccl.library", "NCCL loads and is the manifest's version", "nccl", compare=("version",))
def nccl_library(node: Node) -> Result:
    want = node.component("nccl", "version")
    info = _nccl_loaded(node)
    if "error" in info:
        return Result(
            "",
            FAIL,
            f"{NCCL} does not load: {info['error']}",
            facts={"version": None},
            hint="the image's NCCL is not on the linker path (`ldconfig -p | grep nccl`, "
            "LD_LIBRARY_PATH): rebuild the image or restore its library path",
        )
    have = nccl_version_name(info["code"])
    facts = {"version": have, "path": info["path"]}
    if want and info["code"] != nccl_version_code(str(want)):
        return Result(
            "",
            FAIL,
            f"the linker loads NCCL {have} from {info['path']}, the manifest says {want}",
            hint="another NCCL comes first on the library path, or the image's content and name "
            "disagree: see nccl.shadow",
            facts=facts,
        )
    return Result("", OK, f"NCCL {have} from {info['path']}", facts=facts)


def nccl_candidates(node: Node) -> list[tuple[str, str]]:
    """Every libnccl.so.2 a process could load, in the linker's order: (real file, where)."""
    found: list[tuple[str, str]] = []
    for d in [d for d in node.env.get("LD_LIBRARY_PATH", "").split(":") if d]:
        found.append((str(node.path(d) / NCCL), "LD_LIBRARY_PATH"))
    rc, out = node.run(["ldconfig", "-p"], timeout=20)
    for line in out.splitlines() if rc == 0 else []:
        m = re.match(r"\s*(libnccl\.so\.2)\s.*=>\s*(\S+)", line)
        if m:
            found.append((str(node.path(m.group(2))), "ldconfig cache"))
    prefix = node.component("python", "prefix")
    if prefix:  # wheels torch or a pip install may load by their own rpath
        for f in sorted(node.path(prefix).glob(f"lib/python3*/site-packages/*/lib/{NCCL}")) + sorted(
            node.path(prefix).glob(f"lib/python3*/site-packages/nvidia/*/lib/{NCCL}")
        ):
            found.append((str(f), "python site-packages"))
    out_, seen = [], set()
    for f, where in found:
        if os.path.exists(f):
            real = os.path.realpath(f)
            if real not in seen:
                seen.add(real)
                out_.append((real, where))
    return out_


@check("nccl.shadow", "no second NCCL shadows the image's one", "nccl.1")
def nccl_shadow(node: Node) -> Result:
    found = nccl_candidates(node)
    loaded = _nccl_loaded(node).get("path")
    facts = {"files": [f for f, _ in found], "loaded": loaded}
    if not found:
        return Result(
            "",
            FAIL,
            f"no {NCCL} on the library path",
            facts=facts,
            hint="the image's NCCL is gone or off the linker path: see nccl.library",
        )
    if len(found) > 1:
        where = "; ".join(
            f"{f} ({w}{', loaded' if loaded and os.path.realpath(loaded) == f else ''})" for f, w in found
        )
        return Result(
            "",
            FAIL,
            f"{len(found)} different NCCL libraries a process could load: {where}",
            hint="remove the extra copy or the LD_LIBRARY_PATH entry that brings it: one NCCL per "
            "image, the one the manifest names (frameworks and plugins must agree on it)",
            facts=facts,
        )
    return Result("", OK, f"one NCCL: {found[0][0]} ({found[0][1]})", facts=facts)


NCCL_INIT_PROBE = r"""
import ctypes, sys
lib = ctypes.CDLL("libnccl.so.2")
comm = ctypes.c_void_p()
rc = lib.ncclCommInitAll(ctypes.byref(comm), 1, (ctypes.c_int * 1)(0))
if rc == 0:
    lib.ncclCommDestroy(comm)
sys.exit(rc)
"""


def parse_nccl_network(log: str) -> dict:
    """What NCCL's INFO log says about its network: {"network", "ib", "socket", "plugin", "lines"}."""
    out: dict = {"network": None, "ib": None, "socket": None, "plugin": None, "lines": []}
    for line in log.splitlines():
        if "NET/" not in line and "Using network" not in line:
            continue
        out["lines"].append(line.split("NCCL INFO", 1)[-1].strip())
        if m := re.search(r"Using network (.+?)\s*$", line):
            out["network"] = m.group(1)
        elif m := re.search(r"NET/IB\s*:\s*Using (.+?)(?:\s*;|$)", line):
            out["ib"] = m.group(1).strip()
        elif "NET/IB" in line and "No device found" in line:
            out["ib"] = "no device found"
        elif m := re.search(r"NET/Socket\s*:\s*Using (.+?)\s*$", line):
            out["socket"] = m.group(1)
        elif m := re.search(r"NET/Plugin\s*:?\s*(.+?)\s*$", line):
            out["plugin"] = m.group(1)
    if out["network"] is None:  # NCCL older than 2.19 names no network: infer it
        out["network"] = "IB" if out["ib"] and out["ib"] != "no device found" else "Socket" if out["socket"] else None
    return out


EFA_FIX = (
    "AWS EFA needs NCCL's aws-ofi-nccl plugin (libnccl-net.so) over libfabric's efa provider, "
    "which this image does not carry: use a trainbase image that does (label "
    "io.trainbase.nccl-net-plugin; docs/choose.md names them), or add AWS's EFA installer (libfabric, aws-ofi-nccl) in an "
    "image built FROM this one; never NCCL_NET=IB (NCCL aborts on EFA)"
)


def efa_fix(node: Node) -> str:
    """What to do where EFA is here and NCCL did not take a plugin: the image's own plugin (the
    manifest's components.nccl_net_plugin) declined or was kept from loading, or there is none."""
    plugin = ((node.manifest() or {}).get("components") or {}).get("nccl_net_plugin")
    if not plugin:
        return EFA_FIX
    net = next((f for f in plugin.get("files", []) if f.endswith("/libnccl-net.so")), plugin.get("prefix", ""))
    return (
        f"this image carries {plugin['name']} {plugin['version']} ({net}), which NCCL loads by itself: "
        "see the NET/Plugin and NET/OFI lines below for why it did not take EFA. Check that "
        "NCCL_NET_PLUGIN and NCCL_NET are unset (or =ofi / name the plugin), that FI_PROVIDER is unset or efa, "
        "that `fi_info -p efa` lists the devices (pass /dev/infiniband/uverbs* in: EKS's EFA device "
        "plugin, `docker run --device`), and that memlock is unlimited; never NCCL_NET=IB (NCCL aborts on EFA)"
    )


@check("nccl.network", "a one-process NCCL init shows which network NCCL selects", "nccl.net")
def nccl_network(node: Node) -> Result:
    info = cuda_driver(node)
    if info.get("error") or not info.get("count"):
        return absent(node, "gpu", "no GPU: NCCL cannot initialise a communicator here", GPU_FLAGS)
    with tempfile.TemporaryDirectory(prefix="tb-doctor-") as tmp:
        env = dict(
            node.env,
            NCCL_DEBUG="INFO",
            NCCL_DEBUG_SUBSYS="INIT,NET",
            NCCL_DEBUG_FILE=f"{tmp}/nccl.%p.log",
            CUDA_VISIBLE_DEVICES=node.env.get("CUDA_VISIBLE_DEVICES", "0"),
        )
        rc, out = node.run([sys.executable, "-c", NCCL_INIT_PROBE], timeout=90, env=env)
        log = "\n".join(p.read_text(errors="replace") for p in Path(tmp).glob("nccl.*.log")) or out
    net = parse_nccl_network(log)
    facts = {
        "network": net["network"],
        "ib": net["ib"],
        "socket": net["socket"],
        "plugin": net["plugin"],
        "log": net["lines"][-12:],
    }
    if rc != 0:
        return Result(
            "",
            FAIL,
            f"ncclCommInitAll on GPU 0 failed (exit {rc}): {out.strip()[-300:]}",
            hint="run with NCCL_DEBUG=INFO to see why; check gpu.driver and nccl.library",
            facts=facts,
        )
    usable = sorted(rdma(node)["uverbs"])
    found = fabric(node)
    facts["fabric"] = found["kinds"]
    chosen = net["network"] or "?"
    efa = sorted(n for n, k in found["devices"].items() if k == "efa")
    plugin_used = not chosen.lower().startswith(("socket", "ib")) and net["network"] is not None
    if efa and not plugin_used:
        # EFA is no InfiniBand: NCCL's IB transport does not drive it, NCCL_NET=IB aborts there
        return Result(
            "",
            FAIL,
            f"AWS EFA devices here ({', '.join(efa)}) and NCCL selected {chosen}: without a network "
            "plugin for EFA NCCL runs its collectives over TCP sockets",
            hint=efa_fix(node),
            facts=facts,
        )
    if plugin_used and not efa:
        return Result(
            "",
            WARN,
            f"NCCL selected the network plugin {chosen} on a node without EFA devices "
            f"({'/'.join(found['kinds']) or 'no RDMA device'} here): a plugin for another fabric runs "
            "instead of NCCL's own transport",
            hint="unset NCCL_NET / NCCL_NET_PLUGIN for this node, or remove the plugin from the image",
            facts=facts,
        )
    if chosen.lower().startswith("socket"):
        if usable:
            why = f"NET/IB said: {net['ib']}" if net["ib"] else "no NET/IB line"
            return Result(
                "",
                FAIL,
                f"NCCL selected sockets although {', '.join(usable)} are here ({why})",
                hint="check ib.provider, mem.memlock and nccl.env (NCCL_IB_DISABLE, NCCL_IB_HCA); a net "
                "plugin that fails to load also drops NCCL to sockets"
                + (
                    "; RoCE: NCCL_IB_GID_INDEX names the RoCE v2 GID where the default is not"
                    if "roce" in found["kinds"]
                    else ""
                ),
                facts=facts,
            )
        return Result(
            "",
            WARN,
            f"NCCL selected sockets ({net['socket']}): no RDMA device here, so traffic between nodes goes over TCP",
            hint="on an RDMA cluster: " + "pass the devices into the container",
            facts=facts,
        )
    if net["network"] is None:
        return Result(
            "",
            WARN,
            "NCCL's log names no network",
            facts=facts,
            hint="NCCL_DEBUG_FILE may be overridden; run with NCCL_DEBUG=INFO and read the NET/ lines",
        )
    on = f" on {'/'.join(found['kinds'])}" if found["kinds"] else ""
    return Result("", OK, f"NCCL selected {chosen}{on}" + (f" ({net['ib']})" if net["ib"] else ""), facts=facts)


CONTRACT_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK")


@check("launch.contract", "the launcher's variables are consistent for this rank", "launch")
def launch_contract(node: Node) -> Result:
    try:
        import trainbase_launch
    except ImportError as e:
        return Result(
            "",
            FAIL,
            f"the launch contract (trainbase_launch) does not import: {e}",
            hint="the image's /opt/trainbase/lib is missing from the Python path",
        )
    try:
        world = trainbase_launch.resolve(node.env)
    except trainbase_launch.LaunchError as e:
        return Result(
            "",
            FAIL,
            f"the launcher's variables do not determine this rank: {e}",
            hint="fix the launch (see the message), or run through `tb-launch`",
        )
    want = world.env()
    facts = {
        "launcher": world.launcher,
        "rank": world.rank,
        "world_size": world.world_size,
        "local_rank": world.local_rank,
        "local_world_size": world.local_world_size,
        "node_rank": world.node_rank,
        "master": f"{world.master_addr}:{world.master_port}",
    }
    if world.launcher == "single":
        return Result("", OK, "a single process: no launcher variables", facts=facts)
    if world.launcher not in ("env", "torchrun"):  # MPI/Slurm: contract variables set by others must agree
        wrong = [
            f"{k}={node.env[k]} (the launcher's {k} is {want[k]})"
            for k in CONTRACT_VARS
            if k in node.env and node.env[k] != want[k]
        ]
        if wrong:
            return Result(
                "",
                FAIL,
                f"{world.launcher} rank {world.rank}: "
                + "; ".join(wrong)
                + ": set by the image or the job spec, not by this launch",
                facts=facts,
                hint="unset them (check the image's ENV and the job's environment) and derive them "
                "with `tb-launch`; OMPI_COMM_WORLD_NODE_RANK is the rank within a node, never NODE_RANK",
            )
    if world.nnodes > 1 and world.master_addr in ("127.0.0.1", "localhost"):
        return Result(
            "",
            FAIL,
            f"{world.nnodes} nodes but MASTER_ADDR is {world.master_addr}",
            facts=facts,
            hint="set MASTER_ADDR to the first node's address (Azure ML: AZ_BATCH_MASTER_NODE)",
        )
    return Result(
        "",
        OK,
        f"{world.launcher}: rank {world.rank}/{world.world_size}, local {world.local_rank}/"
        f"{world.local_world_size}, node {world.node_rank}/{world.nnodes}, master {facts['master']}",
        facts=facts,
    )


def llm_capabilities(cc: tuple[int, int]) -> dict[str, bool]:
    """What the LLM stack (TransformerEngine + FlashAttention-4) can run on a GPU of compute
    capability ``cc``: FP8 GEMMs with delayed or current scaling need sm_89+ (Ada, Hopper,
    Blackwell; TE's fp8_autocast raises below), MXFP8 block scaling Blackwell (sm_100+), and
    FlashAttention-4's CuTe DSL kernels exist for Hopper (sm_90) and Blackwell data-center GPUs
    (sm_100, sm_103) only."""
    return {"fp8": cc >= (8, 9), "mxfp8": cc >= (10, 0), "fa4": cc[0] in (9, 10)}


@check("gpu.llm_stack", "the GPUs can use the image's FP8 (TransformerEngine) and FlashAttention-4 kernels", "fp8/fa4")
def gpu_llm_stack(node: Node) -> Result:
    # the GPU first, like every gpu check: --expect gpu on a node without one fails them all
    info = cuda_driver(node)
    if info.get("error") or not info.get("count"):
        return absent(node, "gpu", "no GPU, so no FP8 or FlashAttention-4 kernel to choose", GPU_FLAGS)
    frameworks = (node.manifest() or {}).get("frameworks") or {}
    if "te" not in frameworks:
        return Result(
            "", SKIP, f"skipped: this image has no TransformerEngine (frameworks: {', '.join(frameworks) or 'none'})"
        )
    gpus = []
    for d in info.get("devices") or []:
        m = re.search(r"^(.*) \(cc (\d+)\.(\d+)\)$", d)
        if m:
            cc = (int(m.group(2)), int(m.group(3)))
            gpus.append({"name": m.group(1), "cc": f"{cc[0]}.{cc[1]}", **llm_capabilities(cc)})
    facts = {
        "fp8": all(g["fp8"] for g in gpus),
        "mxfp8": all(g["mxfp8"] for g in gpus),
        "fa4": all(g["fa4"] for g in gpus),
        "gpus": gpus,
    }
    lacking = []
    for g in gpus:
        missing = [what for what, key in (("FP8", "fp8"), ("FlashAttention-4", "fa4")) if not g[key]]
        if missing:
            lacking.append(f"{g['name']} (cc {g['cc']}): no {' or '.join(missing)}")
    names = ", ".join(sorted({f"{g['name']} (cc {g['cc']})" for g in gpus}))
    if not gpus:
        return Result(
            "", WARN, "the CUDA driver named no compute capability", hint="run tb-doctor --only gpu", facts=facts
        )
    if lacking:
        return Result(
            "",
            WARN,
            "; ".join(lacking),
            hint="on these GPUs train in bf16 (TransformerEngine without fp8_autocast) and use torch's "
            "scaled_dot_product_attention instead of FlashAttention-4; FP8 needs sm_89+, FA4 sm_90 or sm_100",
            facts=facts,
        )
    extra = " and MXFP8" if facts["mxfp8"] else ""
    return Result("", OK, f"FP8{extra} (TransformerEngine) and FlashAttention-4 on every GPU: {names}", facts=facts)
