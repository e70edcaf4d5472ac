"""A fake node for the in-image doctor (imagefs/opt/trainbase/lib/trainbase_doctor): a
directory tree standing in for /sys, /dev, /proc and /etc, and fakes for what the process
would ask the system (dlopen, subprocesses, limits)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from .conftest import ROOT

LIB = ROOT / "imagefs" / "opt" / "trainbase" / "lib"


def import_doctor():
    """Import the package the images ship, without leaving bytecode in imagefs/ (it would be
    copied into images; render/recipes.py leaves it out of recipes too)."""
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    if str(LIB) not in sys.path:
        sys.path.insert(0, str(LIB))
    try:
        return importlib.import_module("trainbase_doctor")
    finally:
        sys.dont_write_bytecode = before


doctor = import_doctor()
core = importlib.import_module("trainbase_doctor.core")

MANIFEST = {
    "name": "openmpi4.1.4-cuda12.8-cudnn9-debian12",
    "schema": 1,
    "components": {
        "cuda": {"version": "12.8"},
        "nccl": {"version": "2.27.5"},
        "mpi": {"kind": "openmpi", "version": "4.1.4", "prefix": "/opt/openmpi"},
        "python": {"prefix": "/opt/trainbase/venv"},
    },
}


class FakeCuda:
    """libcuda.so.1 as the CUDA driver API answers: cuInit's code, the driver's CUDA version, and
    whether the GPU supports DMA-BUF (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 124; None: a driver
    older than CUDA 11.7 that does not know the attribute, CUDA_ERROR_INVALID_VALUE)."""

    def __init__(self, init_rc: int = 0, driver_cuda: int = 12080, gpus: int = 1, dmabuf: bool | None = None):
        self.init_rc, self.driver_cuda, self.gpus, self.dmabuf = init_rc, driver_cuda, gpus, dmabuf

    def cuInit(self, flags):
        return self.init_rc

    def cuDriverGetVersion(self, ref):
        ref._obj.value = self.driver_cuda
        return 0

    def cuDeviceGetCount(self, ref):
        ref._obj.value = self.gpus
        return 0

    def cuDeviceGet(self, ref, i):
        ref._obj.value = i
        return 0

    def cuDeviceGetName(self, buf, n, dev):
        buf.value = b"NVIDIA H100 80GB HBM3"
        return 0

    def cuDeviceGetAttribute(self, ref, attr, dev):
        if attr == 124 and self.dmabuf is None:
            return 1
        ref._obj.value = 9 if attr == 75 else int(bool(self.dmabuf)) if attr == 124 else 0
        return 0


class FakeNccl:
    def __init__(self, code: int):
        self.code = code

    def ncclGetVersion(self, ref):
        ref._obj.value = self.code
        return 0


class FakeNode(core.Node):
    def __init__(
        self,
        root: Path,
        env: dict | None = None,
        expect=(),
        manifest: dict | None = MANIFEST,
        libs: dict | None = None,
        commands: dict | None = None,
        memlock: int = -1,
        caps: int = 0,
        shm: int | None = 8 << 30,
        driver: str | None = None,
        cma: int = 0,
        unwritable: dict[str, str] | None = None,
    ):
        super().__init__(env=env or {"PATH": "/usr/bin:/bin"}, root=root, expect=expect)
        if manifest is not None:
            self.write("/etc/trainbase/manifest.json", json.dumps(manifest))
        if driver:
            self.write("/proc/driver/nvidia/version", f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Sat")
        self.libs, self.commands = libs or {}, commands or {}
        self._memlock, self._caps, self._shm, self._cma = memlock, caps, shm, cma
        self._unwritable = unwritable or {}  # directory -> why it cannot be written (others can)
        self.loaded: dict[str, str] = {}

    def write(self, path: str, text: str = "") -> Path:
        p = self.path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p

    def load(self, soname):
        if soname not in self.libs:
            raise OSError(f"{soname}: cannot open shared object file: No such file or directory")
        lib, path = self.libs[soname]
        self.loaded[soname] = path
        return lib

    def loaded_from(self, soname):
        return self.loaded.get(soname)

    def run(self, argv, timeout=20, env=None):
        for prefix, answer in self.commands.items():
            if " ".join(argv).startswith(prefix):
                return answer
        return 127, f"{argv[0]}: not found"

    def memlock(self):
        return self._memlock

    def cma_probe(self):
        return self._cma

    def unwritable(self, p):
        return self._unwritable.get(p, "")

    def capabilities(self):
        return self._caps

    def statvfs_bytes(self, p):
        return self._shm if p == "/dev/shm" else None

    def rdma_device(self, name: str, uverbs: int | None, state: str = "4: ACTIVE", driver: str = "mlx5_core"):
        """A host RDMA device in sysfs; with ``uverbs``, its verbs node handed to the container."""
        port = f"/sys/class/infiniband/{name}/ports/1"
        for f, v in (
            ("state", state),
            ("phys_state", "5: LinkUp"),
            ("link_layer", "InfiniBand"),
            ("rate", "400 Gb/sec (4X NDR)"),
        ):
            self.write(f"{port}/{f}", v)
        drv = self.path(f"/sys/bus/pci/drivers/{driver}")
        drv.mkdir(parents=True, exist_ok=True)
        self.path(f"/sys/class/infiniband/{name}/device").mkdir(parents=True, exist_ok=True)
        link = self.path(f"/sys/class/infiniband/{name}/device/driver")
        if not link.exists():
            link.symlink_to(drv)
        if uverbs is not None:
            self.write(f"/sys/class/infiniband_verbs/uverbs{uverbs}/ibdev", name)
            self.write(f"/dev/infiniband/uverbs{uverbs}")


def result(node: core.Node, check_id: str) -> core.Result:
    return core.run_checks(node, [core.CHECKS[check_id]])[0]


def fake_mpi_launchers(prefix: Path) -> tuple[Path, Path]:
    """Executable `mpirun` and `mpiexec` stubs under PREFIX/bin (what the launcher checks look
    for on PATH); (mpirun, mpiexec)."""
    for name in ("mpirun", "mpiexec"):
        f = prefix / "bin" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("#!/bin/sh\n")
        f.chmod(0o755)
    return prefix / "bin" / "mpirun", prefix / "bin" / "mpiexec"
