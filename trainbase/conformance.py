"""Shared pieces of the conformance suite (tests/conformance).

The suite proves that an image does what its name and its own manifest
(/etc/trainbase/manifest.json) claim. This module holds the plumbing the tests share,
so that each test stays a name, a command and what must hold:

* :func:`probe_host` -- what this host really offers containers (GPU, RDMA devices) and
  the ``docker run`` flags that follow from it;
* :class:`Container` -- a long-running container (``sleep infinity``) to exec into;
* :class:`MpiFlavor` -- how to launch, version-check and read rank variables for the MPI
  kind a manifest names (Open MPI, Intel MPI); chosen from the manifest, never per image;
* :func:`scan_layers` -- every layer of an image, streamed from ``docker save`` (files
  deleted by a later layer are still in the earlier one, and still published);
* :class:`Results` -- the image x check matrix, written as Markdown and per-image JUnit.

Standard library only; everything goes through the docker CLI.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST_PATH = "/etc/trainbase/manifest.json"
LABEL = "io.trainbase.conformance"  # put on every container/network/image the suite makes
TIERS = ("static", "cpu", "multinode", "gpu", "fabric")
# What a check proves, declared by each test with ``@pytest.mark.evidence(KIND)``. A check that
# could load or run the thing but only looks for it ("presence") lets through images whose file
# is there and broken (UCX's IB module deleted, a truncated provider, a tool missing its
# library): the report prints their share so it only goes down.
EVIDENCE = {
    "run": "runs the thing and checks what it computed or printed",
    "load": "loads the thing (dlopen, import, component open) and queries it",
    "content": "reads what the image carries (layers, labels, manifest, environment) where nothing runs",
    "presence": "only looks for a file, a path, a listing or build-time configuration",
}


def docker() -> str:
    """The docker client: ``$TRAINBASE_DOCKER`` or the first ``docker`` on PATH (any client
    works for run/exec/save; testinfra's docker:// backend uses the one on PATH too)."""
    return os.environ.get("TRAINBASE_DOCKER") or shutil.which("docker") or "docker"


def run(args: list[str], timeout: float = 120, check: bool = False, **kw: Any) -> subprocess.CompletedProcess:
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{shlex.join(args)} exited {p.returncode}: {(p.stderr or p.stdout).strip()[-2000:]}")
    return p


# --------------------------------------------------------------------------- host facts

@dataclass
class HostCaps:
    """What containers on this host can be given, and why (said in every report)."""

    gpu: bool
    gpu_why: str
    ib_devices: list[str]
    ib_why: str
    shm_size: str = "1g"
    init: bool = True

    @property
    def ib(self) -> bool:
        return bool(self.ib_devices)

    def run_flags(self) -> list[str]:
        flags = [f"--shm-size={self.shm_size}"]
        if self.init:
            flags.append("--init")  # reaps orphaned sshd/orted children of docker exec
        if self.gpu:
            flags += ["--gpus", "all"]
        for dev in self.ib_devices:
            flags += ["--device", dev]
        if self.ib:
            # Registered (pinned) memory for verbs. A higher memlock ulimit would help too but
            # needs CAP_SYS_RESOURCE in the engine, which not every host grants.
            flags += ["--cap-add", "IPC_LOCK"]
        return flags

    def describe(self) -> dict[str, str]:
        return {
            "gpu": ("yes" if self.gpu else "no") + f" ({self.gpu_why})",
            "ib": ("yes" if self.ib else "no") + f" ({self.ib_why})",
            "run_flags": " ".join(self.run_flags()),
        }


def probe_host(shm_size: str = "1g") -> HostCaps:
    """GPUs count only when ``nvidia-smi -L`` lists one AND the engine can hand them to a
    container (an ``nvidia`` runtime or the nvidia-container-cli hook); RDMA counts when
    /dev/infiniband has device nodes."""
    gpu, gpu_why = False, ""
    smi = shutil.which("nvidia-smi")
    if not smi:
        gpu_why = "nvidia-smi not found"
    else:
        try:
            p = run([smi, "-L"], timeout=30)
            gpus = [ln for ln in p.stdout.splitlines() if ln.startswith("GPU ")]
            if p.returncode != 0 or not gpus:
                gpu_why = f"nvidia-smi -L exited {p.returncode}: {(p.stderr or p.stdout).strip()[:120]}"
            else:
                runtimes = run([docker(), "info", "--format", "{{json .Runtimes}}"], timeout=30).stdout
                if "nvidia" in runtimes or shutil.which("nvidia-container-cli"):
                    gpu, gpu_why = True, f"{len(gpus)} GPU(s): " + "; ".join(g.split(" (")[0] for g in gpus)
                else:
                    gpu_why = f"{len(gpus)} GPU(s) but no NVIDIA container runtime in the engine"
        except (OSError, subprocess.TimeoutExpired) as e:
            gpu_why = f"nvidia-smi failed: {e}"
    ib_dir = Path("/dev/infiniband")
    devices = sorted(str(p) for p in ib_dir.iterdir()) if ib_dir.is_dir() else []
    ib_why = (f"{len(devices)} device node(s) in /dev/infiniband" if devices
              else "/dev/infiniband absent" if not ib_dir.exists() else "/dev/infiniband is empty")
    init = Path("/usr/bin/docker-init").exists() or Path("/usr/libexec/docker/docker-init").exists()
    return HostCaps(gpu=gpu, gpu_why=gpu_why, ib_devices=devices, ib_why=ib_why, shm_size=shm_size, init=init)


# --------------------------------------------------------------------------- containers

def short_name(ref: str) -> str:
    """``trainbase/openmpi4.1.4-...-debian12:r399db00a30bb`` -> ``openmpi4.1.4-...-debian12:r399db00a30bb``."""
    return ref.rsplit("/", 1)[-1]


def inspect_image(ref: str) -> dict[str, Any]:
    p = run([docker(), "image", "inspect", ref], timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"image {ref} is not in the engine: {p.stderr.strip()}")
    return json.loads(p.stdout)[0]


@dataclass
class Container:
    cid: str
    name: str
    image: str
    hostname: str = ""

    @classmethod
    def start(cls, image: str, flags: Iterable[str] = (), *, hostname: str | None = None,
              network: str | None = None, prefix: str = "tbconf") -> "Container":
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        args = [docker(), "run", "-d", "--name", name, "--label", f"{LABEL}=1", *flags]
        if hostname:
            args += ["--hostname", hostname]
        if network:
            args += ["--network", network]
            if hostname:
                args += ["--network-alias", hostname]
        # Keep the image's entrypoint (NVIDIA bases wrap "$@"); replace only the command.
        args += [image, "sleep", "infinity"]
        p = run(args, timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"docker run {image} failed: {p.stderr.strip()}")
        return cls(cid=p.stdout.strip(), name=name, image=image, hostname=hostname or "")

    def exec(self, cmd: str, timeout: float = 120, env: dict[str, str] | None = None,
             login: bool = False) -> subprocess.CompletedProcess:
        """Run ``cmd`` through ``/bin/sh -c`` (the image's ENV, like testinfra) or, with
        ``login``, through ``bash -lc`` (what /etc/profile makes of it)."""
        shell = ["bash", "-lc"] if login else ["/bin/sh", "-c"]
        envs = [a for k, v in (env or {}).items() for a in ("-e", f"{k}={v}")]
        return run([docker(), "exec", *envs, self.cid, *shell, cmd], timeout=timeout)

    def put(self, src: str | Path, dst: str) -> None:
        run([docker(), "cp", str(src), f"{self.cid}:{dst}"], timeout=60, check=True)

    def write(self, path: str, text: str) -> None:
        p = subprocess.run([docker(), "exec", "-i", self.cid, "/bin/sh", "-c", f"cat > {shlex.quote(path)}"],
                           input=text, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"writing {path} in {self.name}: {p.stderr.strip()}")

    def read(self, path: str) -> str:
        p = self.exec(f"cat {shlex.quote(path)}", timeout=30)
        if p.returncode != 0:
            raise FileNotFoundError(f"{path} in {self.image}: {p.stderr.strip()}")
        return p.stdout

    def remove(self) -> None:
        run([docker(), "rm", "-f", "-v", self.cid], timeout=120)


def create_network() -> str:
    name = f"tbconf-net-{uuid.uuid4().hex[:8]}"
    # A user-defined bridge: containers resolve each other by name/alias. --internal keeps
    # the test traffic off any outside network.
    run([docker(), "network", "create", "--internal", "--label", f"{LABEL}=1", name], timeout=60, check=True)
    return name


def remove_network(name: str) -> None:
    run([docker(), "network", "rm", name], timeout=60)


# --------------------------------------------------------------------------- MPI flavours

@dataclass(frozen=True)
class MpiFlavor:
    """What differs between MPI implementations, chosen by the manifest's ``mpi.kind``."""

    kind: str
    version: str
    prefix: str
    launchers: tuple[str, ...]
    version_command: str
    version_regex: str  # group 1 = version, applied to version_command's stdout
    library_regex: str  # group 1 = version, applied to MPI_Get_library_version()
    rank_vars: dict[str, str] = field(default_factory=dict)  # rank/size/local_rank/local_size

    @staticmethod
    def from_manifest(manifest: dict[str, Any]) -> "MpiFlavor":
        mpi = manifest["components"]["mpi"]
        kind, version, prefix = mpi["kind"], str(mpi["version"]), mpi.get("prefix", "")
        if kind == "openmpi":
            return MpiFlavor(
                kind, version, prefix, ("mpirun", "mpiexec"), "mpirun --version",
                r"\((?:Open MPI|OpenRTE)\)\s+(\d[\w.]*)", r"Open MPI v(\d[\w.]*?)(?:[,\s]|$)",
                {"rank": "OMPI_COMM_WORLD_RANK", "size": "OMPI_COMM_WORLD_SIZE",
                 "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK", "local_size": "OMPI_COMM_WORLD_LOCAL_SIZE"})
        if kind == "intelmpi":
            return MpiFlavor(
                kind, version, prefix, ("mpiexec", "mpirun"), "mpiexec --version",
                r"Version\s+(\d[\w.]*)", r"Intel\(R\) MPI Library\s+(\d[\w.]*)",
                {"rank": "PMI_RANK", "size": "PMI_SIZE",
                 "local_rank": "MPI_LOCALRANKID", "local_size": "MPI_LOCALNRANKS"})
        raise ValueError(f"the conformance suite does not know MPI kind {kind!r} (manifest components.mpi.kind)")

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def local(self, n: int) -> str:
        """Launch ``n`` ranks in one container. Open MPI refuses more ranks than cores
        without oversubscription (a host fact, not an image one: 2 cores here)."""
        if self.kind == "openmpi":
            if self.major >= 5:
                return f"mpirun -np {n} --map-by :OVERSUBSCRIBE"
            return f"mpirun -np {n} --oversubscribe"
        return f"mpiexec -n {n}"

    def across(self, hosts: list[str], per_host: int) -> str:
        n = len(hosts) * per_host
        if self.kind == "openmpi":
            return f"mpirun -np {n} -H " + ",".join(f"{h}:{per_host}" for h in hosts) + " --map-by slot"
        return f"mpiexec -hosts {','.join(hosts)} -n {n} -ppn {per_host}"


def nccl_version_code(version: str) -> int:
    """NCCL_VERSION_CODE as ``ncclGetVersion`` returns it (the formula changed at 2.9)."""
    major, minor, patch = (int(x) for x in version.split(".")[:3])
    if (major, minor) >= (2, 9):
        return major * 10000 + minor * 100 + patch
    return major * 1000 + minor * 100 + patch


def cudnn_version_code(version: str) -> int:
    """CUDNN_VERSION as ``cudnnGetVersion`` returns it (x10 for the major from cuDNN 9)."""
    major, minor, patch = (int(x) for x in version.split(".")[:3])
    if major >= 9:
        return major * 10000 + minor * 100 + patch
    return major * 1000 + minor * 100 + patch


def cuda_version_code(version: str) -> int:
    """CUDART_VERSION as ``cudaRuntimeGetVersion`` returns it: "12.8" -> 12080."""
    major, minor = (int(x) for x in version.split(".")[:2])
    return major * 1000 + minor * 10


# --------------------------------------------------------------------------- layers

@dataclass
class LayerFile:
    layer: int  # 0 = bottom layer
    path: str  # without a leading slash
    kind: str  # file, dir, symlink, link, other
    size: int
    content: bytes | None = None  # only for the files the caller asked for


@dataclass
class LayerScan:
    image: str
    layers: list[str]  # layer tar names in order, bottom first
    created_by: list[str]  # the Dockerfile instruction of each layer (from the image history)
    files: list[LayerFile]
    seconds: float = 0.0

    def where(self, f: LayerFile) -> str:
        cmd = self.created_by[f.layer] if f.layer < len(self.created_by) else ""
        cmd = re.sub(r"\s+", " ", cmd).strip()
        cmd = re.sub(r"^(\|\d+ \S+=\S+ )?/bin/(ba)?sh (-o pipefail )?-c ", "RUN ", cmd)
        return f"/{f.path} (layer {f.layer + 1}/{len(self.layers)}: {cmd[:90]})"


_TAR_MAGIC_OFFSET = 257


def _is_tar_head(head: bytes) -> bool:
    return head[:2] == b"\x1f\x8b" or head[_TAR_MAGIC_OFFSET:_TAR_MAGIC_OFFSET + 5] == b"ustar"


class _Prefixed(io.RawIOBase):
    """A stream that first returns ``head`` then the rest of ``rest``."""

    def __init__(self, head: bytes, rest: Any):
        self.head, self.rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.head:
            n = min(len(b), len(self.head))
            b[:n], self.head = self.head[:n], self.head[n:]
            return n
        data = self.rest.read(len(b))
        b[:len(data)] = data
        return len(data)


def scan_layers(image: str, want_content: Callable[[str, int], bool], max_content: int = 4 << 20) -> LayerScan:
    """Stream ``docker save IMAGE`` and list every entry of every layer (whiteouts included
    as the ``.wh.`` names they are). ``want_content(path, size)`` says which regular files'
    bytes to keep (at most ``max_content`` bytes each). Works with the classic save layout
    (``<id>/layer.tar``) and the OCI one (``blobs/sha256/<digest>``)."""
    t0 = time.monotonic()
    proc = subprocess.Popen([docker(), "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            bufsize=1 << 20)
    assert proc.stdout is not None
    per_blob: dict[str, list[LayerFile]] = {}
    jsons: dict[str, bytes] = {}
    try:
        outer = tarfile.open(fileobj=proc.stdout, mode="r|", bufsize=1 << 20)
        for m in outer:
            if not m.isfile():
                continue
            if m.name.endswith(".json") or m.name.endswith("/json") or (m.size < 1 << 20 and m.name.startswith("blobs/")):
                data = outer.extractfile(m).read()  # type: ignore[union-attr]
                jsons[m.name] = data
                continue
            f = outer.extractfile(m)
            assert f is not None
            head = f.read(512)
            if not _is_tar_head(head):
                continue
            entries: list[LayerFile] = []
            inner = tarfile.open(fileobj=io.BufferedReader(_Prefixed(head, f), 1 << 20), mode="r|*",
                                 bufsize=1 << 20)
            for im in inner:
                path = im.name.lstrip("./").lstrip("/") if im.name not in (".", "./") else ""
                kind = ("file" if im.isreg() else "dir" if im.isdir() else "symlink" if im.issym()
                        else "link" if im.islnk() else "other")
                lf = LayerFile(layer=-1, path=path, kind=kind, size=im.size)
                if im.isreg() and want_content(path, im.size):
                    ef = inner.extractfile(im)
                    lf.content = ef.read(max_content) if ef else None
                entries.append(lf)
            per_blob[m.name] = entries
    finally:
        proc.stdout.close()
        rc = proc.wait()
    if rc != 0:
        raise RuntimeError(f"docker save {image} exited {rc}: {proc.stderr.read().decode(errors='replace')[-500:]}")
    # Layer order and history come from the save's manifest.json and the image config.
    manifest = json.loads(jsons["manifest.json"])[0]
    order: list[str] = manifest["Layers"]
    config = json.loads(jsons[manifest["Config"]])
    created = [h.get("created_by", "") for h in config.get("history", []) if not h.get("empty_layer")]
    files: list[LayerFile] = []
    for i, name in enumerate(order):
        for lf in per_blob.get(name, []):
            lf.layer = i
            files.append(lf)
    return LayerScan(image=image, layers=order, created_by=created, files=files,
                     seconds=time.monotonic() - t0)


_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.S)
_PEM_KEY = re.compile(rb"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----")


def pem_certificates(data: bytes) -> set[str]:
    """SHA-256 fingerprints of the PEM certificates in ``data``."""
    out = set()
    for body in _PEM_CERT.findall(data):
        try:
            out.add(hashlib.sha256(base64.b64decode(b"".join(body.split()))).hexdigest())
        except ValueError:
            continue
    return out


def has_private_key(data: bytes) -> bool:
    return bool(_PEM_KEY.search(data))


def record_hashes(record: bytes, site: str) -> dict[str, str]:
    """A wheel's RECORD: installed path (relative to /) -> urlsafe-b64 sha256."""
    out = {}
    for line in record.decode(errors="replace").splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[1].startswith("sha256="):
            out[str(PurePosixPath(site, parts[0]))] = parts[1][len("sha256="):]
    return out


def wheel_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


# --------------------------------------------------------------------------- reports

OUTCOME_ORDER = {"failed": 0, "error": 1, "passed": 2, "skipped": 3}


@dataclass
class Outcome:
    image: str
    module: str
    check: str  # test name without the image parameter
    outcome: str = "passed"  # passed | failed | skipped | error
    message: str = ""
    seconds: float = 0.0
    longrepr: str = ""
    order: tuple = ()  # (module, line): rows follow the test files


@dataclass
class Results:
    """Collected by the conftest from pytest's reports; rendered at the end of the session."""

    host: dict[str, str] = field(default_factory=dict)
    images: dict[str, dict[str, str]] = field(default_factory=dict)  # image -> facts (id, size, ...)
    rows: dict[tuple[str, str, str], Outcome] = field(default_factory=dict)
    evidence: dict[tuple[str, str], str] = field(default_factory=dict)  # (module, check) -> EVIDENCE kind

    def evidence_summary(self) -> str:
        """One line: how many distinct checks prove what, and the presence-only share."""
        if not self.evidence:
            return ""
        n = len(self.evidence)
        kinds = {k: sum(1 for v in self.evidence.values() if v == k) for k in EVIDENCE}
        share = 100.0 * kinds["presence"] / n
        parts = ", ".join(f"{k} {kinds[k]}" for k in EVIDENCE)
        return f"Evidence: {n} checks: {parts}; presence-only share {share:.1f} %"

    def add(self, image: str, module: str, check: str, when: str, outcome: str, message: str,
            seconds: float, longrepr: str = "", order: tuple = ()) -> None:
        key = (image, module, check)
        o = self.rows.setdefault(key, Outcome(image, module, check, order=order or (module, 0)))
        o.seconds += seconds
        if when == "call" or (when == "setup" and outcome != "passed"):
            o.outcome, o.message, o.longrepr = outcome, message, longrepr
        elif when == "teardown" and outcome == "failed" and o.outcome == "passed":
            o.outcome, o.message, o.longrepr = "error", "teardown: " + message, longrepr

    def counts(self, image: str) -> dict[str, int]:
        c = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        for o in self.rows.values():
            if o.image == image:
                c[o.outcome] = c.get(o.outcome, 0) + 1
        return c

    def seconds(self, image: str) -> float:
        return sum(o.seconds for o in self.rows.values() if o.image == image)

    def markdown(self) -> str:
        images = list(self.images) or sorted({o.image for o in self.rows.values()})
        firsts: dict[tuple[str, str], tuple] = {}
        for o in self.rows.values():
            firsts.setdefault((o.module, o.check), (o.order, o.check))
        checks = sorted(firsts, key=firsts.__getitem__)
        lines = ["# Conformance summary", ""]
        lines += ["Host: " + "; ".join(f"{k}: {v}" for k, v in self.host.items()), ""]
        if self.evidence:
            lines += [self.evidence_summary(), ""]
            presence = sorted(f"{m}::{c}" for (m, c), k in self.evidence.items() if k == "presence")
            if presence:
                lines += ["Presence-only checks: " + ", ".join(presence), ""]
        lines += ["| image | passed | failed | error | skipped | time (s) | facts |", "|---|---|---|---|---|---|---|"]
        for im in images:
            c = self.counts(im)
            facts = ", ".join(f"{k} {v}" for k, v in self.images.get(im, {}).items())
            lines.append(f"| {im} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} | "
                         f"{self.seconds(im):.1f} | {facts} |")
        lines += ["", "| check | " + " | ".join(images) + " |", "|---|" + "---|" * len(images)]
        for module, check in checks:
            cells = []
            for im in images:
                o = self.rows.get((im, module, check))
                cells.append(_cell(o))
            lines.append(f"| {module}::{check} | " + " | ".join(cells) + " |")
        failed = [o for o in self.rows.values() if o.outcome in ("failed", "error")]
        if failed:
            lines += ["", "## Failures", ""]
            for o in failed:
                lines.append(f"- **{o.image}** `{o.module}::{o.check}`: {_one_line(o.message, 400)}")
        return "\n".join(lines) + "\n"

    def junit(self, image: str, properties: dict[str, str]) -> bytes:
        rows = [o for o in self.rows.values() if o.image == image]
        c = self.counts(image)
        suite = ET.Element("testsuite", name=f"conformance {image}", tests=str(len(rows)),
                           failures=str(c["failed"]), errors=str(c["error"]), skipped=str(c["skipped"]),
                           time=f"{self.seconds(image):.3f}")
        props = ET.SubElement(suite, "properties")
        for k, v in {**properties, **{f"image.{k}": v for k, v in self.images.get(image, {}).items()}}.items():
            ET.SubElement(props, "property", name=k, value=str(v))
        for o in rows:
            tc = ET.SubElement(suite, "testcase", classname=f"conformance.{o.module}", name=f"{o.check}[{image}]",
                               time=f"{o.seconds:.3f}")
            if o.outcome == "failed":
                ET.SubElement(tc, "failure", message=_one_line(o.message, 1000)).text = o.longrepr
            elif o.outcome == "error":
                ET.SubElement(tc, "error", message=_one_line(o.message, 1000)).text = o.longrepr
            elif o.outcome == "skipped":
                ET.SubElement(tc, "skipped", message=_one_line(o.message, 1000))
        ET.indent(suite)
        return ET.tostring(suite, encoding="utf-8", xml_declaration=True)


def _one_line(s: str, n: int) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _cell(o: Outcome | None) -> str:
    if o is None:
        return "-"
    if o.outcome == "passed":
        return "pass"
    word = {"failed": "**FAIL**", "error": "**ERROR**", "skipped": "skip"}[o.outcome]
    return f"{word}: {_one_line(o.message, 90)}".replace("|", "\\|")


def safe_filename(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s)
