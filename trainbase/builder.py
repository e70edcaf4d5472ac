"""`build.py --matrix`: build the selected cells through the Docker engine.

A plan is a dependency graph: framework cells are built FROM their parent cell's immutable
tag, so parents are built first (and once); cells that share a stage prefix share its
layers through BuildKit's cache. Builds run in parallel (-j), each writes its own log, and
an image is tagged only when its build completed (`docker build -t` tags at the very end),
so an interrupted or failed build leaves no tag behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from . import engine, publish, registry
from .errors import TrainbaseError
from .matrix import Cell, Matrix
from .render import Rendered
from .publish import ALIAS
from .states import JobState

DEFAULT_CA = "/etc/ssl/certs/ca-certificates.crt"



@dataclass
class Job:
    rendered: Rendered
    image: str                          # namespace/name:immutable-tag
    selected: bool                      # False: built only because a selected cell needs it
    status: JobState = JobState.QUEUED
    reason: str | None = None
    started: float | None = None
    ended: float | None = None
    log: str | None = None
    size: int | None = None
    image_id: str | None = None
    last_line: str = ""
    pushed: list[str] = field(default_factory=list)
    repo_digest: str | None = None

    @property
    def cell(self) -> Cell:
        return self.rendered.cell

    @property
    def name(self) -> str:
        return self.cell.name

    @property
    def tag(self) -> str:
        return self.rendered.tag

    @property
    def parent(self) -> str | None:
        return self.cell.parent

    @property
    def duration(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended or time.monotonic()) - self.started


@dataclass
class Options:
    jobs: int = 1
    ca_bundle: str | None = None
    network: str | None = None
    log_dir: Path = Path("logs")
    dry_run: bool = False
    push: bool = False
    registry: str | None = None
    no_cache: bool = False
    min_free_gb: float = 10.0


def _ca_bundle(value: str | None) -> str | None:
    """--ca-bundle auto|none|PATH. auto: the host's bundle if it has one (it is passed as a
    BuildKit secret, so it never lands in a layer; behind an intercepting proxy it is what
    lets pip and curl inside the build verify TLS)."""
    if value in (None, "auto"):
        return DEFAULT_CA if Path(DEFAULT_CA).exists() else None
    if value == "none":
        return None
    if not Path(value).is_file():
        raise TrainbaseError(f"--ca-bundle {value}: no such file")
    return value


class Builder:
    def __init__(self, m: Matrix, rendered: dict[str, Rendered], selected: list[Cell], opts: Options, root: Path,
                 out=None):
        self.m, self.rendered, self.opts, self.root = m, rendered, opts, root
        self.out = out or sys.stdout
        ns = m.spec.naming.namespace
        names = {c.name for c in selected}
        order: list[str] = []

        def visit(name: str) -> None:
            if name in order:
                return
            parent = rendered[name].cell.parent
            if parent:
                visit(parent)
            order.append(name)

        for c in selected:
            visit(c.name)
        self.jobs: dict[str, Job] = {
            n: Job(rendered=rendered[n], image=f"{ns}/{n}:{rendered[n].tag}", selected=n in names) for n in order
        }
        self.lock = threading.Lock()
        self.procs: dict[str, subprocess.Popen] = {}
        self.interrupted = False
        self.ca = _ca_bundle(opts.ca_bundle)
        self.run_id = time.strftime("%Y%m%d-%H%M%S")
        self.publish_error: str | None = None

    # -- plan -----------------------------------------------------------------------------
    def children(self, name: str) -> list[Job]:
        return [j for j in self.jobs.values() if j.cell.parent == name]

    def stage_groups(self) -> dict[str, list[str]]:
        """Base cells whose first stage (OS, compilers, IB userspace) is byte-identical:
        BuildKit builds those layers once and every cell of the group reuses them."""
        groups: dict[str, list[str]] = {}
        for j in self.jobs.values():
            if j.cell.parent:
                continue
            text = j.rendered.files[j.rendered.dockerfile]
            head = text.split("\n# ---- stage", 2)
            key = hashlib.sha256((head[1] if len(head) > 1 else text).encode()).hexdigest()[:8]
            groups.setdefault(key, []).append(j.name)
        return groups

    def preflight(self) -> None:
        """Mark what needs no build (cached) or cannot be built (refused), before starting."""
        for j in self.jobs.values():
            pending = [a for a in j.rendered.context.artifacts if self.m.spec.artifacts[a].pending]
            if pending:
                a = self.m.spec.artifacts[pending[0]]
                j.status, j.reason = JobState.REFUSED, (f"artifact {pending[0]} has no verified sha256 "
                                                 f"({' '.join(a.pending_reason.split())})")
            elif not self.opts.no_cache and not self.opts.dry_run and engine.image_exists(j.image):
                j.status, j.reason = JobState.CACHED, "this recipe's immutable tag is already in the engine"
            elif self.opts.dry_run and engine.engine_available(timeout=3) and engine.image_exists(j.image):
                j.status, j.reason = JobState.CACHED, "this recipe's immutable tag is already in the engine"
            elif self.opts.registry and not self.opts.no_cache and not self.opts.dry_run:
                self._pull_from_registry(j)
        self._propagate()

    def _pull_from_registry(self, j: Job) -> None:
        """The same recipe already published (e.g. by another CI runner): pull it instead of
        rebuilding. This is how a fan-out job gets the parent its cell is built FROM. Asked
        with the stored credentials; a refusal stops the run (registry.RegistryAuthError)."""
        host, ns = registry.split_registry(self.opts.registry or "")
        if registry.tag_state(host, f"{ns}/{j.name}", j.tag) != "present":
            return
        remote = f"{host}/{ns}/{j.name}:{j.tag}"
        registry.pull(host, remote)
        if subprocess.run([engine.docker_cli(), "tag", remote, j.image]).returncode == 0:
            j.status, j.reason = JobState.CACHED, f"pulled {remote} (same recipe)"

    def _propagate(self) -> None:
        changed = True
        while changed:
            changed = False
            for j in self.jobs.values():
                p = self.jobs.get(j.cell.parent) if j.cell.parent else None
                if j.status == JobState.QUEUED and p is not None and p.status.bad:
                    j.status, j.reason = JobState.SKIPPED, f"its parent {p.name} {p.status}"
                    j.ended = j.ended or time.monotonic()
                    changed = True

    def print_plan(self) -> None:
        w = self.out.write
        w(f"plan: {len(self.jobs)} image(s), {sum(j.selected for j in self.jobs.values())} selected, "
          f"-j {self.opts.jobs}\n")
        level: dict[str, int] = {}
        for n, j in self.jobs.items():
            level[n] = level[j.cell.parent] + 1 if j.cell.parent in level else 0
        for lv in sorted(set(level.values())):
            w(f"  step {lv + 1}:\n")
            for n in [n for n in self.jobs if level[n] == lv]:
                j = self.jobs[n]
                what = {JobState.QUEUED: "build", JobState.CACHED: "cached", JobState.REFUSED: "REFUSED",
                        JobState.SKIPPED: "skip"}.get(j.status, str(j.status))
                extra = f"  FROM {j.cell.parent}" if j.cell.parent else ""
                dep = "" if j.selected else "  (needed by a selected cell)"
                w(f"    {what:<8} {j.image}{extra}{dep}\n")
                if j.reason and j.status != JobState.CACHED:
                    w(f"             {j.reason}\n")
        groups = [g for g in self.stage_groups().values() if len(g) > 1]
        for g in groups:
            w(f"  shared os/ib stage (built once): {', '.join(g)}\n")

    # -- base images --------------------------------------------------------------------------
    def ensure_bases(self) -> None:
        bases: dict[str, list[Job]] = {}
        for j in self.jobs.values():
            if j.status == JobState.QUEUED and not j.cell.parent:
                bases.setdefault(j.rendered.context.data["os"]["base"], []).append(j)
        for ref, jobs in bases.items():
            row = self.m.spec.os[jobs[0].cell.os]
            try:
                engine.ensure_base_image(ref, row.bootstrap.suite if row.bootstrap else None,
                                         row.bootstrap.mirror if row.bootstrap else engine.DEFAULT_MIRROR,
                                         log=lambda s: self.out.write(f"base: {s}\n"))
            except engine.EngineError as e:
                for j in jobs:
                    j.status, j.reason = JobState.FAILED, f"base image {ref} unavailable: {str(e).splitlines()[0]}"
                    j.ended = time.monotonic()
        self._propagate()

    def check_space(self) -> None:
        todo = [j for j in self.jobs.values() if j.status == JobState.QUEUED]
        if not todo:
            return
        root = _docker_root()
        free = shutil.disk_usage(root).free / 1e9 if root and Path(root).exists() else None
        if free is not None and free < self.opts.min_free_gb:
            raise TrainbaseError(f"only {free:.1f} GB free under {root}; building {len(todo)} image(s) needs "
                                 f"at least {self.opts.min_free_gb:g} GB (prune with `docker system prune`, or "
                                 f"lower the bar with --min-free-gb)")

    # -- build ---------------------------------------------------------------------------------
    def command(self, j: Job) -> list[str]:
        cmd = [engine.docker_cli(), "build", "--progress=plain", "-f", j.rendered.dockerfile,
               "-t", j.image,
               "--label", f"io.trainbase.recipe={j.rendered.recipe}",
               "--label", f"org.opencontainers.image.version={j.tag}",
               "--build-arg", f"TRAINBASE_NAMESPACE={self.m.spec.naming.namespace}"]
        if not j.cell.parent:
            cmd += ["--target", "image"]
        if self.ca:
            cmd += ["--secret", f"id=ca_bundle,src={self.ca}"]
        if self.opts.network:
            cmd += ["--network", self.opts.network]
        if self.opts.no_cache:
            cmd += ["--no-cache"]
        return cmd + ["."]

    def build_one(self, j: Job) -> None:
        logdir = self.opts.log_dir / self.run_id
        logdir.mkdir(parents=True, exist_ok=True)
        j.log = str(logdir / f"{j.name}.log")
        cmd = self.command(j)
        env = dict(os.environ, DOCKER_BUILDKIT="1")
        with self.lock:
            if self.interrupted:
                j.status, j.reason = JobState.INTERRUPTED, "not started: interrupted"
                return
            j.status, j.started = JobState.BUILDING, time.monotonic()
        # line-buffered: `tail -f` on a running build's log (and anything waiting for a step's
        # output) sees each line as BuildKit prints it, not in 8 KiB chunks
        with open(j.log, "w", buffering=1) as log:
            log.write("$ " + " ".join(cmd) + "\n\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, errors="replace", start_new_session=True)
            with self.lock:
                self.procs[j.name] = proc
            tail: list[str] = []
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                s = line.strip()
                if s:
                    j.last_line = s[:160]
                    tail = (tail + [s])[-400:]
            rc = proc.wait()
        with self.lock:
            self.procs.pop(j.name, None)
            j.ended = time.monotonic()
            if self.interrupted:
                j.status, j.reason = JobState.INTERRUPTED, "build stopped by Ctrl-C (no tag was written)"
            elif rc != 0:
                j.status, j.reason = JobState.FAILED, _failure_reason(tail, rc)
            else:
                j.status = JobState.BUILT
        if j.status == JobState.BUILT:
            self._inspect(j)
            subprocess.run([engine.docker_cli(), "tag", j.image, j.image.rsplit(":", 1)[0] + ":" + ALIAS],
                           capture_output=True)

    def _inspect(self, j: Job) -> None:
        r = subprocess.run([engine.docker_cli(), "image", "inspect", "--format", "{{.Id}} {{.Size}}", j.image],
                           capture_output=True, text=True)
        if r.returncode == 0:
            iid, size = r.stdout.split()
            j.image_id, j.size = iid, int(size)

    def run(self) -> int:
        self.preflight()
        if self.opts.dry_run:
            self.print_plan()
            return 0
        if not engine.engine_available():
            raise TrainbaseError("no Docker engine answers"
                                 + (f" at DOCKER_HOST={os.environ['DOCKER_HOST']}" if os.environ.get("DOCKER_HOST") else "")
                                 + ": run scripts/setup.sh (it starts one)")
        self.check_space()
        self.ensure_bases()
        for j in self.jobs.values():
            if j.status == JobState.CACHED:
                self._inspect(j)
        progress = Progress(self)
        progress.start()
        pool = ThreadPoolExecutor(max_workers=max(1, self.opts.jobs))
        running: dict[Future, Job] = {}
        old = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        try:
            while True:
                for j in self.jobs.values():
                    if j.status != JobState.QUEUED or len(running) >= self.opts.jobs:
                        continue
                    p = self.jobs.get(j.cell.parent) if j.cell.parent else None
                    if p is None or p.status.usable:
                        j.status = JobState.STARTING
                        running[pool.submit(self.build_one, j)] = j
                if not running:
                    break
                done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                for f in done:
                    job = running.pop(f)
                    if f.exception() is not None:
                        job.status, job.reason = JobState.FAILED, f"internal error: {f.exception()}"
                        job.ended = time.monotonic()
                    progress.event(job)
                self._propagate()
                progress.tick()
        except KeyboardInterrupt:
            self.stop()
            for f in list(running):
                try:
                    f.result(timeout=60)
                except Exception:
                    pass
            for j in self.jobs.values():
                if j.status in (JobState.QUEUED, JobState.STARTING):
                    j.status, j.reason = JobState.INTERRUPTED, "not started: interrupted"
        finally:
            signal.signal(signal.SIGTERM, old)
            pool.shutdown(wait=True, cancel_futures=True)
            progress.stop()
        if self.opts.push and not self.interrupted:
            self.push()
        if self.interrupted:
            return 130
        return 1 if self.publish_error or any(j.status.bad for j in self.jobs.values()) else 0

    def stop(self) -> None:
        """Ctrl-C: stop every running build (SIGINT to its process group, then SIGKILL).
        docker build tags only after success, so nothing half-built keeps a tag."""
        with self.lock:
            self.interrupted = True
            procs = list(self.procs.values())
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)

    # -- publish --------------------------------------------------------------------------------
    def push(self) -> None:
        def tag_local(src: str, dst: str) -> None:
            subprocess.run([engine.docker_cli(), "tag", src, dst], check=True, capture_output=True)

        try:
            publish.publish(self.jobs.values(), self.opts.registry or "", tag_local, out=self.out)
        except registry.RegistryError as e:
            self.publish_error = str(e)
            self.out.write(f"publish: STOPPED: {e}\n")

    # -- report --------------------------------------------------------------------------------
    def report(self) -> dict:
        engine_version = ""
        try:
            engine_version = subprocess.run([engine.docker_cli(), "version", "--format", "{{.Server.Version}}"],
                                            capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:
            pass
        counts: dict[str, int] = {}
        for j in self.jobs.values():
            counts[j.status] = counts.get(j.status, 0) + 1
        return {
            "schema": 1,
            "run_id": self.run_id,
            "engine": {"docker_host": os.environ.get("DOCKER_HOST", ""), "server_version": engine_version},
            "namespace": self.m.spec.naming.namespace,
            "registry": self.opts.registry if self.opts.push else None,
            "publish_error": self.publish_error,
            "counts": counts,
            "cells": [
                {
                    "name": j.name,
                    "selected": j.selected,
                    "image": j.image,
                    "tag": j.tag,
                    "alias": j.image.rsplit(":", 1)[0] + ":" + ALIAS,
                    "recipe": j.rendered.recipe,
                    "parent": j.cell.parent,
                    "axes": j.cell.axes,
                    "status": j.status,
                    "reason": j.reason,
                    "duration_s": round(j.duration, 1) if j.duration is not None else None,
                    "size_bytes": j.size,
                    "image_id": j.image_id,
                    "pushed": j.pushed,
                    "repo_digest": j.repo_digest,
                    "log": j.log,
                    "manifest": j.rendered.context.manifest,
                }
                for j in self.jobs.values()
            ],
        }


def _docker_root() -> str | None:
    try:
        r = subprocess.run([engine.docker_cli(), "info", "--format", "{{.DockerRootDir}}"],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or None
    except Exception:
        return None


_ERROR_LINE = re.compile(r"(?i)(error|failed|no space left|denied|not found|mismatch|refusing|assert)")


def _failure_reason(tail: list[str], rc: int) -> str:
    """The most telling line of a failed build's log: the last line that looks like an error."""
    for s in reversed(tail):
        if "no space left on device" in s.lower():
            return "no space left on device (free disk space or prune the build cache)"
    noise = re.compile(r"^(#\d+ )?(ERROR: )?(executor failed|failed to solve|------|> \[|\[.*\] RUN )")
    lines = [re.sub(r"^#\d+ [\d.]+ ", "", s) for s in tail if not noise.match(s)]
    for pattern in (r"ERROR: |mismatch|refusing|tb-\S+: ", r"(?i)\berror\b", _ERROR_LINE.pattern):
        for s in reversed(lines):
            if re.search(pattern, s) and not re.fullmatch(r"(?i)error: subprocess-exited-with-error", s.strip()):
                return s.strip()[:300]
    return f"docker build exited {rc}" + (f": {tail[-1][:200]}" if tail else "")


class Progress:
    """Live progress: a rich table on a terminal, one line per event (plus a heartbeat) in CI."""

    HEARTBEAT = 60.0

    def __init__(self, b: Builder):
        self.b = b
        self.live = None
        self.t0 = time.monotonic()
        self.last_beat = self.t0
        self.tty = b.out.isatty() if hasattr(b.out, "isatty") else False

    def _table(self):
        from rich.table import Table

        t = Table(title=f"trainbase build ({_fmt(time.monotonic() - self.t0)})", expand=False)
        for col in ("cell", "status", "time", "last log line"):
            t.add_column(col, overflow="ellipsis", no_wrap=True, max_width=70 if col != "time" else 8)
        for j in self.b.jobs.values():
            t.add_row(j.name, j.status, _fmt(j.duration) if j.duration else "",
                      j.last_line if j.status == JobState.BUILDING else (j.reason or ""))
        return t

    def start(self) -> None:
        counts = {}
        for j in self.b.jobs.values():
            counts[j.status] = counts.get(j.status, 0) + 1
        self.b.out.write("build: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + "\n")
        if self.tty:
            from rich.live import Live

            self.live = Live(self._table(), refresh_per_second=2, transient=False)
            self.live.start()

    def tick(self) -> None:
        if self.live:
            self.live.update(self._table())
        elif time.monotonic() - self.last_beat > self.HEARTBEAT:
            self.last_beat = time.monotonic()
            for j in self.b.jobs.values():
                if j.status == JobState.BUILDING:
                    self.b.out.write(f"  ... {j.name}: building {_fmt(j.duration)} | {j.last_line[:100]}\n")
            self.b.out.flush()

    def event(self, j: Job) -> None:
        if not self.live:
            done = sum(not x.status.pending for x in self.b.jobs.values())
            why = f" ({j.reason})" if j.reason and j.status != JobState.BUILT else ""
            self.b.out.write(f"[{done}/{len(self.b.jobs)}] {j.name}: {j.status} in {_fmt(j.duration)}{why}\n")
            self.b.out.flush()

    def stop(self) -> None:
        if self.live:
            self.live.update(self._table())
            self.live.stop()


def _fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{seconds:.1f}s"


def summary(b: Builder, out=None) -> None:
    """The table a person reads at the end: cell, tag, status, duration, size, digest."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out or sys.stdout, width=200)
    t = Table(title="trainbase build summary")
    for col in ("cell", "tag", "status", "time", "size", "image id / digest", "reason"):
        t.add_column(col, overflow="fold")
    for j in b.jobs.values():
        digest = j.repo_digest or (j.image_id[:19] if j.image_id else "")
        size = f"{j.size / 1e9:.2f} GB" if j.size else ""
        t.add_row(j.name + ("" if j.selected else " (dep)"), j.tag, j.status, _fmt(j.duration), size, digest,
                  j.reason if j.status != JobState.CACHED else "")
    console.print(t)
    counts: dict[str, int] = {}
    for j in b.jobs.values():
        counts[j.status] = counts.get(j.status, 0) + 1
    console.print("result: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))


def write_report(b: Builder, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(b.report(), indent=2) + "\n")
