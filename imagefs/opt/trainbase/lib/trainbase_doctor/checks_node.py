"""The node under the container: the image itself, GPUs and driver, memory limits, mounts."""

from __future__ import annotations

import os
import re

from .core import FAIL, OK, WARN, Node, Result, check, human_bytes
from .cuda_requirement import Host, admits, branch_of, cuda_of, first_driver_for, forward_compat, version_tuple
from .hardware import GPU_FLAGS, absent, cuda_driver, gpu_models, rdma

# The oldest driver branch each CUDA major runs on through minor-version compatibility
# (NVIDIA's CUDA compatibility guide): a driver older than this cannot run the image at all.
MIN_DRIVER_FOR_MAJOR = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
# NVIDIA's forward-compatibility libraries in the nvidia/cuda bases (cuda-compat-X-Y): libcuda.so.<driver>
COMPAT_DIR = "/usr/local/cuda/compat"
COMPAT_FIX = (
    "start it through the NVIDIA container runtime (it selects them: libnvidia-container's cuda-compat-mode), or "
    "through the image's entry points (/usr/local/bin/python, mpirun, torchrun...: /opt/trainbase/env.sh selects "
    "them), or put " + COMPAT_DIR + " first on LD_LIBRARY_PATH"
)
# Mount points every container has: they say nothing about how this one was started.
RUNTIME_MOUNTS = re.compile(r"^/(proc|sys|dev(/pts|/mqueue|/console)?|etc/(hosts|hostname|resolv\.conf))(/|$)")


@check("image.manifest", "the image's manifest is there and names the image", "image", compare=("fingerprint",))
def image_manifest(node: Node) -> Result:
    m = node.manifest()
    if not m:
        return Result(
            "",
            FAIL,
            "no readable /etc/trainbase/manifest.json: this is not a trainbase image, or it was altered",
            hint="run the image trainbase built; the checks below compare against it",
        )
    facts = {"name": m.get("name"), "fingerprint": node.image_fingerprint()}
    return Result("", OK, f"{m.get('name')} (content fingerprint {facts['fingerprint']})", facts=facts)


@check("gpu.visible", "GPUs are visible to this process", "gpus", compare=("count",))
def gpu_visible(node: Node) -> Result:
    info = cuda_driver(node)
    visible = {k: node.env[k] for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES") if k in node.env}
    if info.get("error") == "no-driver":
        return absent(node, "gpu", "no GPU: " + info["detail"], GPU_FLAGS, {"count": 0})
    if info.get("error") == "no-device":
        return absent(
            node,
            "gpu",
            f"no GPU: the driver is here but {info['detail']} {visible or ''}".rstrip(),
            "check CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES and that the GPUs are handed to the container",
            {"count": 0},
        )
    if info.get("error"):
        return Result(
            "",
            FAIL,
            f"the CUDA driver does not initialise: {info['detail']}",
            hint="compare the host driver with the image's CUDA (`nvidia-smi`); 803 means the "
            "container's libcuda and the kernel module differ: do not ship libcuda in the image",
            facts={"count": 0},
        )
    if info["count"] == 0:
        return absent(node, "gpu", "no GPU: the driver reports 0 devices", GPU_FLAGS, {"count": 0})
    return Result(
        "",
        OK,
        f"{info['count']} GPU(s): " + "; ".join(info["devices"]),
        facts={"count": info["count"], "devices": info["devices"], **visible},
    )


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


@check("gpu.driver", "the driver is new enough for the image's CUDA", "driver", compare=("driver_version",))
def gpu_driver(node: Node) -> Result:
    info = cuda_driver(node)
    want = str(node.component("cuda", "version") or "")
    if info.get("error") in ("no-driver", "no-device") or (not info.get("error") and not info.get("count")):
        return absent(
            node,
            "gpu",
            "no GPU, so no driver to compare with the image's CUDA " + want,
            GPU_FLAGS,
            {"driver_version": None},
        )
    have, drv = info.get("driver_cuda"), info.get("driver_version")
    facts = {"driver_version": drv, "driver_cuda": have, "image_cuda": want}
    if not want:
        return Result(
            "",
            WARN,
            f"driver {drv} (CUDA {have}); the manifest names no CUDA version",
            hint="run an image built by trainbase (its manifest names its CUDA)",
            facts=facts,
        )
    if have and _version_tuple(have) >= _version_tuple(want):
        return Result("", OK, f"driver {drv or '?'} supports CUDA {have}, the image needs {want}", facts=facts)
    major = _version_tuple(want)[0]
    floor = MIN_DRIVER_FOR_MAJOR.get(major)
    if have and drv and floor and _version_tuple(have)[0] == major and _version_tuple(drv) >= _version_tuple(floor):
        return Result(
            "",
            WARN,
            f"driver {drv} supports CUDA {have}, older than the image's {want}: it runs only "
            "through minor-version compatibility (no PTX JIT of newer code, some APIs fail)",
            hint=f"upgrade the host driver to one for CUDA {want} or newer",
            facts=facts,
        )
    if floor is None:
        # a CUDA major this doctor has no driver floor for (newer than the doctor): say what is
        # known -- the driver's CUDA is older than the image's -- and no invented branch number
        return Result(
            "",
            FAIL,
            f"driver {drv or '?'} supports CUDA {have or '?'}; the image's CUDA {want} needs a "
            f"driver for CUDA {major}.x, and this doctor knows no minimum driver for CUDA {major}",
            hint=f"upgrade the host driver to one whose `nvidia-smi` shows CUDA Version {want} or newer "
            f"(NVIDIA's CUDA {major} release notes list the minimum branch), or use an image built for "
            f"CUDA {have or 'the driver'}",
            facts=facts,
        )
    return Result(
        "",
        FAIL,
        f"driver {drv or '?'} supports CUDA {have or '?'}; the image's CUDA {want} needs at least driver {floor}",
        hint=f"upgrade the host driver (CUDA {major}.x needs "
        f"R{floor.split('.')[0]} or newer) or use an image built for CUDA {have or 'the driver'}",
        facts=facts,
    )


def _compat_libcuda(node: Node) -> str | None:
    """The version of the forward-compatibility libcuda the image carries (570.124.06), or None."""
    d = node.path(COMPAT_DIR)
    found = sorted((p.name[len("libcuda.so.") :] for p in d.glob("libcuda.so.*.*")), key=_version_tuple)
    return found[-1] if found else None


def _libcuda_version(path: str | None) -> str | None:
    m = re.search(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$", path or "")
    return m.group(1) if m else None


def _runtime_brand(model: str) -> str:
    """The brand libnvidia-container would name (its driver.c), guessed from the GPU's name."""
    for brand in ("GeForce", "TITAN", "Quadro", "Tesla"):
        if brand.lower() in model.lower():
            return brand
    return "Unknown"  # NVML_BRAND_NVIDIA (A100, H100, B200...) and the rest, as driver.c names them


@check(
    "gpu.forward_compat",
    "CUDA forward compatibility is used exactly when this driver needs it",
    "cudapath",
    compare=("path",),
)
def gpu_forward_compat(node: Node) -> Result:
    """Which way this node's driver runs the image's CUDA: natively (a driver whose CUDA is at
    least the image's), or through the forward-compatibility libcuda the Ubuntu rows carry in
    /usr/local/cuda/compat (an older data-center driver branch that the compat package supports:
    the brand=...,driver>=N alternatives of the image's NVIDIA_REQUIRE_CUDA). The compat libcuda
    must be loaded on the second way and never on the first: forced on a driver that supports the
    CUDA itself, every CUDA call fails with error 803; on a GeForce, with 804."""
    info = cuda_driver(node)
    want = str(node.component("cuda", "version") or "")
    if info.get("error") in ("no-driver", "no-device") or (not info.get("error") and not info.get("count")):
        # like every gpu check: a skip, a failure under --expect gpu
        return absent(node, "gpu", "no GPU, so no driver to choose a CUDA path for", GPU_FLAGS, {"path": None})
    drv = info.get("driver_version")
    if not drv:
        rc, out = node.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        drv = out.split()[0] if rc == 0 and out.split() else None
    models = gpu_models(node)
    compat = _compat_libcuda(node)
    loaded = node.loaded_from("libcuda.so.1")
    in_use = _libcuda_version(loaded)
    if not drv or not want:
        return Result(
            "",
            WARN,
            f"cannot tell the CUDA path: driver version {drv or 'unknown'}, image CUDA {want or 'unknown'}",
            hint="run an image built by trainbase on a node whose /proc/driver/nvidia/version or nvidia-smi answers",
            facts={"path": None},
        )
    have = cuda_of(drv)
    branch = branch_of(drv)
    requirement = node.env.get("NVIDIA_REQUIRE_CUDA", "")
    branches = forward_compat(requirement).branches
    consumer = [m for m in models if _runtime_brand(m) in ("GeForce", "TITAN")]
    brand = _runtime_brand(consumer[0] if consumer else (models[0] if models else ""))
    runtime = admits(node.env, Host.of(drv, brand))
    via_compat = bool(in_use) and branch_of(in_use or "0") != branch
    facts = {
        "driver_version": drv,
        "driver_cuda": have,
        "image_cuda": want,
        "compat_libcuda": compat,
        "compat_branches": list(branches),
        "libcuda_in_use": loaded,
        "gpus": models,
        "runtime_admits": runtime.starts,
    }
    native = have is None or version_tuple(have) >= version_tuple(want)
    said_driver = f"driver {drv} (R{branch}, CUDA {have or 'newer than this doctor knows'})"
    if native:
        facts["path"] = "native"
        if via_compat:
            return Result(
                "",
                FAIL,
                f"{said_driver} runs CUDA {want} itself, but this process loaded the forward-compatibility libcuda "
                f"{in_use} ({loaded}): on a driver that does not need it every CUDA call fails (error 803)",
                hint=f"take {COMPAT_DIR} off LD_LIBRARY_PATH (or set TRAINBASE_CUDA_COMPAT=0); the image's "
                "entry points and NVIDIA's runtime add it only below its branch",
                facts=facts,
            )
        return Result(
            "",
            OK,
            f"{said_driver} runs the image's CUDA {want} natively; the forward-compatibility libraries"
            + (f" (libcuda {compat}) are not used, as they must not be" if compat else " are not needed"),
            facts=facts,
        )
    need = first_driver_for(want)
    upgrade = f"a driver for CUDA {want} ({need} or newer)" if need else f"a driver for CUDA {want}"
    same_major = version_tuple(have or "0")[0] == version_tuple(want)[0]
    refused = "" if runtime.starts else f"; the NVIDIA container runtime refuses the image here ({runtime.message})"
    # a compat libcuda of the driver's own branch or older cannot serve it (libnvidia-container
    # leaves it out; the CUDA forward-compatibility package is a newer branch's user-mode driver)
    stale = compat is not None and branch_of(compat) <= branch
    if compat is None or stale:
        facts["path"] = "minor-version" if same_major else "none"
        carries = (
            f"the image's compat libcuda {compat} is of R{branch_of(compat or '0')}, no newer than the driver's branch"
            if stale
            else "this image carries no forward-compatibility libraries"
        )
        return Result(
            "",
            WARN if same_major else FAIL,
            f"{said_driver} is older than the image's CUDA {want}, and {carries}"
            + refused
            + (
                ": where it starts anyway it runs through minor-version compatibility only (no PTX newer than the driver's)"
                if same_major
                else ": CUDA fails to initialise (error 35, insufficient driver)"
            ),
            hint=f"upgrade to {upgrade}"
            + (
                ""
                if stale
                else ", or take this image's Ubuntu row on a data-center GPU (its nvidia/cuda base carries the "
                "forward-compatibility libraries)"
            ),
            facts=facts,
        )
    if consumer or (branches and branch not in branches):
        facts["path"] = "none"
        why = (
            f"forward compatibility does not run on {consumer[0]} (data-center GPUs only)"
            if consumer
            else f"the image's forward-compatibility libcuda {compat} supports drivers of "
            + "/".join(f"R{b}" for b in branches)
            + f", not R{branch}"
        )
        return Result(
            "",
            FAIL,
            f"{said_driver} is older than the image's CUDA {want} and {why}"
            + refused
            + (f"; this process loaded the compat libcuda {in_use} anyway (CUDA error 804)" if via_compat else ""),
            hint=f"upgrade to {upgrade}",
            facts=facts,
        )
    if via_compat:
        facts["path"] = "forward-compat"
        return Result(
            "",
            OK,
            f"{said_driver} is older than the image's CUDA {want}: it runs through forward compatibility, "
            f"with the image's compat libcuda {in_use} ({loaded}), as NVIDIA supports on data-center GPUs",
            facts=facts,
        )
    facts["path"] = "minor-version" if same_major else "none"
    return Result(
        "",
        WARN if same_major else FAIL,
        f"{said_driver} needs the image's forward-compatibility libcuda {compat} for CUDA {want}, but this "
        f"process loaded {loaded or 'no libcuda'}"
        + (
            ": it runs through minor-version compatibility only (no PTX newer than the driver's)"
            if same_major
            else ": CUDA fails to initialise (error 35, insufficient driver)"
        ),
        hint=COMPAT_FIX,
        facts=facts,
    )


@check("mem.memlock", "locked-memory limit allows RDMA registration", "memlock", compare=("limit_bytes",))
def memlock(node: Node) -> Result:
    limit = node.memlock()
    ipc_lock = bool(node.capabilities() >> 14 & 1)  # CAP_IPC_LOCK lets a process pin past the limit
    facts = {"limit_bytes": limit, "cap_ipc_lock": ipc_lock}
    if limit < 0:
        return Result("", OK, "memlock unlimited", facts=facts)
    if ipc_lock:
        return Result(
            "", OK, f"memlock {human_bytes(limit)}, but CAP_IPC_LOCK lets RDMA pin memory past it", facts=facts
        )
    hint = (
        f"memlock limit is {human_bytes(limit)}: RDMA needs unlimited — run the container with "
        "`--ulimit memlock=-1` (or `--cap-add IPC_LOCK`); under Slurm/ssh launchers the limit of the "
        "daemon that starts the ranks applies"
    )
    if rdma(node)["devices"]:
        return Result(
            "",
            FAIL,
            f"memlock {human_bytes(limit)} with RDMA devices here: memory registration "
            "(ibv_reg_mr) fails with ENOMEM once NCCL/UCX pin their buffers",
            hint=hint,
            facts=facts,
        )
    return Result(
        "",
        WARN,
        f"memlock {human_bytes(limit)}: no RDMA device here, but on an RDMA node registration would fail",
        hint=hint,
        facts=facts,
    )


@check("mem.shm", "/dev/shm is large enough for NCCL and data loaders", "shm", compare=("size_bytes",))
def shm(node: Node) -> Result:
    size = node.statvfs_bytes("/dev/shm")
    hint = "run the container with `--shm-size=16g` or `--ipc=host` (Kubernetes: an emptyDir with medium: Memory at /dev/shm)"
    if size is None:
        return Result(
            "",
            FAIL,
            "/dev/shm is missing: NCCL's shared-memory transport and torch's DataLoader workers fail",
            hint=hint,
            facts={"size_bytes": None},
        )
    facts = {"size_bytes": size}
    local = int(
        node.env.get("LOCAL_WORLD_SIZE")
        or node.env.get("OMPI_COMM_WORLD_LOCAL_SIZE")
        or node.env.get("MPI_LOCALNRANKS")
        or 1
    )
    gpus = cuda_driver(node).get("count") or 0
    if size < 256 << 20:
        if local > 1 or gpus > 1:
            return Result(
                "",
                FAIL,
                f"/dev/shm is {human_bytes(size)} (Docker's default is 64 MiB): too small for "
                f"NCCL between {max(local, gpus)} local processes/GPUs",
                hint=hint,
                facts=facts,
            )
        return Result(
            "",
            WARN,
            f"/dev/shm is {human_bytes(size)} (Docker's default is 64 MiB): enough for one "
            "process, too small once several processes or GPUs share this node",
            hint=hint,
            facts=facts,
        )
    if size < 1 << 30:
        return Result(
            "",
            WARN,
            f"/dev/shm is {human_bytes(size)}: multi-GPU NCCL and DataLoader workers want several GiB",
            hint=hint,
            facts=facts,
        )
    return Result("", OK, f"/dev/shm is {human_bytes(size)}", facts=facts)


CMA_FIX = (
    "Docker 20.10: `--cap-add SYS_PTRACE` (Docker >= 23 allows it on kernels >= 4.8); Kubernetes: "
    "securityContext.capabilities.add [SYS_PTRACE]; Charliecloud: `ch-run --join` (one namespace per node); "
    "Apptainer: `--sharens`; enroot/pyxis: one container per node, not per task; Yama: ptrace_scope <= 1"
)


@check("mem.cma", "processes on this node can read each other's memory (MPI single-copy)", "cma", compare=("cma",))
def cma(node: Node) -> Result:
    """Which single-copy path the node's MPI can use. Without cross-memory attach, large
    messages between ranks of one node take two copies through shared memory -- or, with a
    transport that falls back to TCP (UCX forced on a host without RDMA devices), go over TCP
    at 0.43x the speed (issue 28)."""
    err = node.cma_probe()
    yama = node.read("/proc/sys/kernel/yama/ptrace_scope")
    configured = (
        node.env.get("OMPI_MCA_btl_vader_single_copy_mechanism")
        or node.env.get("OMPI_MCA_btl_sm_single_copy_mechanism")
        or node.env.get("OMPI_MCA_smsc")
    )
    facts = {"cma": err == 0, "errno": err, "yama_ptrace_scope": yama, "single_copy_configured": configured}
    if err == 0:
        path = (
            "copy-in/copy-out (the image sets single_copy_mechanism=none; CMA would work here)"
            if configured == "none"
            else "CMA (one copy, process_vm_readv)"
        )
        facts["single_copy"] = "none (configured)" if configured == "none" else "cma"
        return Result("", OK, f"cross-memory attach works between local processes: MPI uses {path}", facts=facts)
    import errno as errnos

    name = errnos.errorcode.get(err, str(err))
    facts["single_copy"] = "none (refused)"
    yama_why = f", or Yama ptrace_scope {yama}" if yama not in (None, "0", "1") else ""
    why = {
        "EPERM": f"refused (seccomp without CAP_SYS_PTRACE, or ranks in different user namespaces{yama_why})",
        "ENOSYS": "not implemented (gVisor or a seccomp ENOSYS rule)",
    }
    return Result(
        "",
        WARN,
        f"cross-memory attach {why.get(name, name)}: large messages between ranks of this node "
        "take two copies through shared memory (about as fast on this image's transports), and any "
        "transport that falls back to TCP for them runs at a fraction of the speed",
        hint=f"let ranks on a node read each other's memory: {CMA_FIX}",
        facts=facts,
    )


def mount_points(node: Node) -> list[str]:
    """Mount points of this container beyond the ones every container has (volumes, tmpfs,
    device trees, /dev/shm): what a node of a job may lack while its peers have it."""
    points = []
    for line in (node.read("/proc/self/mountinfo") or "").splitlines():
        parts = line.split()
        if len(parts) > 4:
            p = parts[4].replace("\\040", " ")
            if p != "/" and not RUNTIME_MOUNTS.match(p) or p == "/dev/shm":
                points.append(p)
    return sorted(set(points))


def mount_options(node: Node, path: str) -> set[str]:
    """The per-mount options (mountinfo's sixth field: rw, nosuid, noexec, ...) of the mount that
    holds ``path``: the one whose mount point is its longest prefix."""
    best, options = -1, ""
    target = os.path.normpath(path)
    for line in (node.read("/proc/self/mountinfo") or "").splitlines():
        parts = line.split()
        if len(parts) < 6:
            continue
        point = parts[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, options = len(point), parts[5]
    return set(options.split(","))


@check("node.mounts", "the container's mounts (compared across nodes)", "mounts", compare=("mounts",))
def mounts(node: Node) -> Result:
    points = mount_points(node)
    return Result(
        "",
        OK,
        f"{len(points)} mount(s) beyond the container's own: {', '.join(points) or 'none'}",
        facts={"mounts": points},
    )


@check("node.tmpdir", "the temporary directory is writable (Open MPI's PMIx session directory, tempfile)", "tmpdir")
def tmpdir(node: Node) -> Result:
    """A read-only root (`docker run --read-only`, Charliecloud/Apptainer images) without a
    writable /tmp: Open MPI 5's PMIx cannot make its session directory and stops with a bare
    mkdir error (issue 22). PMIx, PRRTE and Python look at TMPDIR, TEMP, TMP, then /tmp."""
    var = next((v for v in ("TMPDIR", "TEMP", "TMP") if node.env.get(v)), None)
    where = node.env[var] if var else "/tmp"
    err = node.unwritable(where)
    facts = {"tmpdir": where, "from": var, "writable": not err, "error": err or None}
    said = f"{var}={where}" if var else "/tmp"
    if not err:
        options = mount_options(node, where)
        facts["noexec"] = "noexec" in options
        if facts["noexec"]:
            # Docker's and Podman's `--tmpfs /tmp` is noexec by default. What a job compiles at
            # start lands here (TorchInductor's cache under gettempdir(), and on a read-only root
            # the home trainbase_user gives an unknown uid, so Triton's ~/.triton and DeepSpeed's
            # ~/.cache/torch_extensions too), and dlopen of a file on a noexec mount fails:
            # "failed to map segment from shared object", at the job's first step on a GPU.
            return Result(
                "",
                WARN,
                f"{said} is writable but mounted noexec: what torch.compile (Triton, TorchInductor), "
                "DeepSpeed's JIT ops and torch.utils.cpp_extension build there cannot be loaded "
                "(ImportError: failed to map segment from shared object)",
                hint="mount it exec (`--tmpfs /tmp:exec` for Docker/Podman; a Kubernetes emptyDir is exec), "
                "or point TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and TORCH_EXTENSIONS_DIR at a writable "
                "directory on an exec mount",
                facts=facts,
            )
        return Result("", OK, f"{said} is writable" + ("" if var else " (no TMPDIR, TEMP or TMP set)"), facts=facts)
    shm = "writable here" if not node.unwritable("/dev/shm") else "not writable here either: mount a tmpfs"
    return Result(
        "",
        FAIL,
        f"{said} is not writable ({err}): Open MPI's PMIx cannot create its session directory "
        "(mpirun and MPI_Init stop with a mkdir error) and Python's tempfile fails",
        hint=f"start the ranks with TMPDIR=/dev/shm ({shm}), or give the container a writable /tmp "
        "(`--tmpfs /tmp` for Docker/Podman, an emptyDir on Kubernetes, a bind mount for ch-run/Apptainer)",
        facts=facts,
    )
