"""The doctor's vocabulary: a check's result, the registry of checks, and the node a check
looks at.

Every check is a function ``(node) -> Result`` registered with ``@check``. A check reads the
node only through ``Node`` (paths under ``node.root``, the environment, library loading,
subprocesses, limits), so unit tests hand it a fake tree instead of /sys, /dev and /proc.
Standard library only: this runs inside every image, with whatever Python it has.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import resource
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

MANIFEST = "/etc/trainbase/manifest.json"
OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STATUSES = (OK, WARN, FAIL, SKIP)
EXPECTABLE = ("gpu", "ib")  # --expect: hardware whose absence is a failure, not a skip


@dataclass
class Result:
    """One check's verdict on this node. ``hint`` is the one-line fix, required for warn and
    fail; ``facts`` are the measured values (also what the cluster table compares)."""

    id: str
    status: str
    summary: str
    hint: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    title: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "summary": self.summary,
            "hint": self.hint,
            "facts": self.facts,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    label: str  # a short column header for the cluster table
    func: Callable[[Node], Result]
    compare: tuple[str, ...] = ()  # facts that must be equal on every node of a job


CHECKS: dict[str, Check] = {}


def check(id: str, title: str, label: str, compare: tuple[str, ...] = ()):
    def register(func: Callable[[Node], Result]) -> Callable[[Node], Result]:
        if id in CHECKS:
            raise RuntimeError(f"check {id} registered twice")
        CHECKS[id] = Check(id, title, label, func, compare)
        return func

    return register


def select(only: list[str] | None) -> list[Check]:
    """Checks by id or by id prefix (``nccl`` = every nccl.* check), in registry order."""
    if not only:
        return list(CHECKS.values())
    unknown = [o for o in only if not any(c == o or c.startswith(o + ".") for c in CHECKS)]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    return [c for cid, c in CHECKS.items() if any(cid == o or cid.startswith(o + ".") for o in only)]


class Node:
    """What the checks may read. ``root`` prefixes every absolute path (tests use a fake
    tree); ``env`` is the process environment the job sees; ``nccl_log``, an NCCL INFO log
    of a real job (--nccl-log) that the GPUDirect check reads instead of running NCCL itself."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        root: str | Path = "/",
        expect: tuple[str, ...] = (),
        nccl_log: str | None = None,
    ) -> None:
        self.env = dict(os.environ if env is None else env)
        self.root = Path(root)
        self.expect = tuple(expect)
        self.nccl_log = nccl_log
        self.cache: dict[str, Any] = {}

    # -- files -------------------------------------------------------------------------
    def path(self, p: str) -> Path:
        return self.root / p.lstrip("/")

    def read(self, p: str, default: str | None = None) -> str | None:
        try:
            return self.path(p).read_text(errors="replace").strip()
        except OSError:
            return default

    def manifest(self) -> dict[str, Any] | None:
        if "manifest" not in self.cache:
            text = self.read(MANIFEST)
            try:
                self.cache["manifest"] = json.loads(text) if text else None
            except ValueError:
                self.cache["manifest"] = None
        return self.cache["manifest"]

    def component(self, *keys: str) -> Any:
        value: Any = (self.manifest() or {}).get("components", {})
        for k in keys:
            value = value.get(k) if isinstance(value, dict) else None
        return value

    # -- the process: overridden by tests ------------------------------------------------
    def load(self, soname: str) -> Any:
        """dlopen through the dynamic linker, as the job's own process would."""
        return ctypes.CDLL(soname)

    def loaded_from(self, soname: str) -> str | None:
        """The file the linker mapped for ``soname`` into this process."""
        stem = soname.split(".so")[0] + ".so"
        for line in (self.read("/proc/self/maps") or "").splitlines():
            p = line.split()[-1] if line.split() else ""
            if "/" in p and p.rsplit("/", 1)[-1].startswith(stem):
                return p
        return None

    def run(self, argv: list[str], timeout: float = 20, env: dict[str, str] | None = None) -> tuple[int, str]:
        """(exit code, stdout+stderr); 127 when the program is missing, 124 on timeout."""
        try:
            p = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, env=self.env if env is None else env, check=False
            )
            return p.returncode, (p.stdout or "") + (p.stderr or "")
        except FileNotFoundError as e:
            return 127, str(e)
        except subprocess.TimeoutExpired:
            return 124, f"timed out after {timeout:.0f} s"

    def memlock(self) -> int:
        """The soft RLIMIT_MEMLOCK in bytes; -1 = unlimited."""
        soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
        return -1 if soft == resource.RLIM_INFINITY else soft

    def capabilities(self) -> int:
        m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", self.read("/proc/self/status") or "", re.M)
        return int(m.group(1), 16) if m else 0

    def cma_probe(self) -> int:
        """Cross-memory attach between two sibling processes, as two MPI ranks on one node do
        it: one process holds a buffer (and, like UCX and Open MPI, allows any process to
        trace it -- PR_SET_PTRACER_ANY -- so Yama's ptrace_scope 1 does not count), a sibling
        reads it with process_vm_readv. 0 when the bytes arrived, else the errno (EPERM: seccomp,
        another user namespace, Yama 2/3; ENOSYS: gVisor)."""
        libc = ctypes.CDLL(None, use_errno=True)

        class IoVec(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

        size = 64
        buf = ctypes.create_string_buffer(size)
        ready_r, ready_w = os.pipe()
        done_r, done_w = os.pipe()
        holder = os.fork()
        if holder == 0:  # the rank that owns the buffer
            try:
                libc.prctl(0x59616D61, ctypes.c_ulong(2**64 - 1), 0, 0, 0)  # PR_SET_PTRACER, ANY
                buf.value = b"trainbase-cma-probe"
                os.write(ready_w, b"1")
                os.read(done_r, 1)
            finally:
                os._exit(0)
        try:
            os.read(ready_r, 1)
            reader = os.fork()
            if reader == 0:  # its sibling, reading it the way MPI's single-copy path does
                code = 1
                try:
                    local = ctypes.create_string_buffer(size)
                    liov = IoVec(ctypes.addressof(local), size)
                    riov = IoVec(ctypes.addressof(buf), size)
                    n = libc.process_vm_readv(holder, ctypes.byref(liov), 1, ctypes.byref(riov), 1, 0)
                    err = ctypes.get_errno()
                    code = 0 if n == size and local.value == b"trainbase-cma-probe" else min(err or 255, 255)
                finally:
                    os._exit(code)
            _, status = os.waitpid(reader, 0)
            return os.waitstatus_to_exitcode(status)
        finally:
            os.write(done_w, b"1")
            os.waitpid(holder, 0)
            for fd in (ready_r, ready_w, done_r, done_w):
                os.close(fd)

    def statvfs_bytes(self, p: str) -> int | None:
        try:
            st = os.statvfs(self.path(p))
        except OSError:
            return None
        return st.f_blocks * st.f_frsize

    # -- facts shared by several checks --------------------------------------------------
    def image_fingerprint(self) -> str:
        """Identifies the image's content from inside it (a container cannot see its image
        digest): the manifest, the OS package database and the Python distributions."""
        h = hashlib.sha256()
        for p in (MANIFEST, "/var/lib/dpkg/status"):
            h.update((self.read(p) or "").encode())
        prefix = self.component("python", "prefix")
        if prefix:
            for sp in sorted(self.path(prefix).glob("lib/python3*/site-packages")):
                h.update("\n".join(sorted(d.name for d in sp.glob("*.dist-info"))).encode())
        return h.hexdigest()[:12]

    def unwritable(self, p: str) -> str:
        """'' when this process can make (and remove) a directory in ``p``, as Open MPI's PMIx
        does for its session directory; else why not, as the OS said it (EROFS: a read-only root)."""
        import errno
        import tempfile

        try:
            os.rmdir(tempfile.mkdtemp(prefix=".tb-doctor-", dir=self.path(p)))
        except OSError as e:
            return f"{errno.errorcode.get(e.errno or 0, e.errno)}: {e.strerror}"
        return ""


def human_bytes(n: int) -> str:
    if n < 0:
        return "unlimited"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def run_checks(node: Node, checks: list[Check]) -> list[Result]:
    """Run each check once; a check that raises is a failure of that check, never of the run."""
    out = []
    for c in checks:
        t0 = time.monotonic()
        try:
            r = c.func(node)
        except Exception as e:  # noqa: BLE001 -- a broken check must not hide the others
            r = Result(
                c.id,
                FAIL,
                f"the check itself crashed: {type(e).__name__}: {e}",
                hint="report this as a trainbase bug, with `tb-doctor --json` output",
            )
        r.id, r.title, r.seconds = c.id, c.title, time.monotonic() - t0
        if r.status not in STATUSES:
            raise RuntimeError(f"check {c.id} returned status {r.status!r}")
        if r.status in (WARN, FAIL) and not r.hint:
            raise RuntimeError(f"check {c.id} returned {r.status} without a fix hint")
        out.append(r)
    return out
