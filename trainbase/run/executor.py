"""`build.py --matrix`: run a build plan through the Docker engine.

The plan (build/plan.py) says what to build and in which order; this module runs it: base images
first (pulled, or bootstrapped where no registry answers), then `docker build` per job
(build/docker_build.py), in parallel up to -j, each job's output in its own log, a parent's failure
skipping its children, Ctrl-C / SIGTERM stopping every build. An image is tagged only when its
build completed (`docker build -t` tags at the very end), so an interrupted or failed build
leaves no tag. After each build the job goes through the supply chain (supply/chain.py) before any
child starts FROM it; at the end the completed cells are published (deliver/publish.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from trainbase_common import emulation, engine, failpoints, processes
from trainbase_common.states import JobState

from ..build import bases, bootstrap, docker_build, sources
from ..build.plan import Job, Plan
from ..define import base_lock
from ..define.matrix import Cell, Matrix
from ..deliver import platforms, publish, registry
from ..deliver.publish import ALIAS
from ..errors import TrainbaseError
from ..render.recipes import Rendered
from ..supply.chain import SupplyChain, SupplyOptions
from . import failures, signals
from .progress import Progress

# The exit code of a run whose every buildable cell is usable but which skipped the cells of a
# platform this host cannot run: not a failure of any recipe, but not the whole selection either.
INCOMPLETE = 3


@dataclass
class Options:
    jobs: int = 1
    ca_bundle: str | None = None
    network: str | None = None
    log_dir: Path = Path("logs")
    dry_run: bool = False
    push: bool = False
    stage: bool = False  # with push: multi-platform repositories go to staging (CI)
    zstd_twin: bool = False  # with push: also TAG-zstd (deliver/publish.py)
    sign_key: Path | None = None  # with push: attach signed SBOM + provenance (deliver/attest.py)
    registry: str | None = None
    no_cache: bool = False
    min_free_gb: float = 10.0
    supply: SupplyOptions | None = None  # None: no supply-chain step (documents, gates, SBOM)


class Executor:
    def __init__(
        self,
        m: Matrix,
        rendered: dict[str, Rendered],
        selected: list[Cell],
        opts: Options,
        root: Path,
        out: TextIO | None = None,
    ) -> None:
        self.m, self.rendered, self.opts, self.root = m, rendered, opts, root
        self.out = out or sys.stdout
        self.plan = Plan(m, rendered, selected)
        self.jobs: dict[str, Job] = self.plan.jobs
        self.lock = threading.Lock()
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.interrupted = False
        # where a signal stopped the run (None: it was not stopped): {"signal", "stage"}
        self.stopped: dict[str, str] | None = None
        self.stage = "plan"
        self.ca = docker_build.ca_bundle(opts.ca_bundle)
        # unique per run, not per second: two runs started together get their own log folders
        self.run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}"
        self.publish_error: str | None = None
        self.emulated: dict[str, str] = {}  # arch -> native | emulated (how), for the report
        self.platform_skipped: dict[str, str] = {}  # cell -> platform this host cannot run (no emulator)
        self.base_refs: dict[str, str] = {}  # a row's base -> what it is built FROM here (official or bootstrap)
        self.supply = (
            SupplyChain(root, opts.supply, self.base_refs, rendered, network=opts.network) if opts.supply else None
        )

    def preflight(self) -> None:
        """Mark what needs no build (cached, or pulled from --registry) and what cannot be
        built (refused), before starting anything."""
        self.plan.refuse_unverified()
        if not self.opts.no_cache:
            if not self.opts.dry_run:
                rebuild = self._locked_images()
                self.plan.mark_cached(lambda ref: ref not in rebuild and engine.image_exists(ref))
            elif engine.available():
                self.plan.mark_cached(engine.image_exists)
        if self.opts.registry and not self.opts.no_cache and not self.opts.dry_run:
            for j in self.jobs.values():
                if j.status == JobState.QUEUED:
                    self._pull_from_registry(j)
        if not self.opts.dry_run:
            self._stage_sources()
        self.plan.propagate()

    def _stage_sources(self) -> None:
        """The pinned sources the builds mount, verified into build-sources/ (GitHub, else the
        mirror); a cell whose source neither gives is refused, loudly, and the rest builds."""
        needed = self.plan.sources_needed()
        if not needed:
            return
        staged, failed = sources.stage_all(self.m.spec.sources, needed, self.root)
        for s in staged.values():
            print(f"source: {s.key}: verified ({s.origin})", file=self.out)
        for key, why in failed.items():
            print(f"source: {key}: NOT AVAILABLE: {why}", file=self.out)
        self.plan.refuse_unsourced(failed)

    def _locked_images(self) -> set[str]:
        """--locked: the selected cells, rebuilt without cache to prove their lock reproduces."""
        if self.supply is None or not self.supply.opts.locked:
            return set()
        return {j.image for j in self.jobs.values() if j.selected}

    def _pull_from_registry(self, j: Job) -> None:
        """The same recipe already published (e.g. by another CI runner): pull it instead of
        rebuilding. This is how a fan-out job gets the parent its cell is built FROM. Asked
        with the stored credentials; a refusal stops the run (registry.RegistryAuthError)."""
        host, ns = registry.split_registry(self.opts.registry or "")
        # a platform of a multi-platform repository is staged by its runner (publish.py)
        repo = next(
            (
                r
                for r in (publish.staging_repo(ns, j.name), f"{ns}/{j.name}")
                if registry.tag_state(host, r, j.tag) == "present"
            ),
            None,
        )
        if repo is None:
            return
        remote = f"{host}/{repo}:{j.tag}"
        registry.pull(host, remote)
        engine.tag(remote, j.image)
        engine.tag(remote, j.image.rsplit(":", 1)[0] + ":" + ALIAS)
        j.status, j.reason = JobState.CACHED, f"pulled {remote} (same recipe)"

    # -- base images --------------------------------------------------------------------------
    def _starts_a_container(self, j: Job) -> bool:
        """Whether this run executes the image's binaries: a build (every RUN line), or a cached
        tag whose supply documents are made now (the inventory runs inside a container of it)."""
        if j.status == JobState.QUEUED:
            return True
        return j.status == JobState.CACHED and self.supply is not None and self.supply.needs_step(j)

    def ensure_emulation(self) -> None:
        """Cells of another architecture than the host's run under qemu: its handler is
        registered now, because such a cell is to be built or a cached one's documents are to be
        made in a container of it (binfmt handlers are gone after a reboot; the images are not).
        A host that cannot run them skips those cells before anything starts, their cached tags
        kept, and the others go on."""
        arches = {j.cell.arch for j in self.jobs.values() if self._starts_a_container(j)}
        try:
            self.emulated = emulation.ensure(arches, log=lambda s: self.out.write(s + "\n"))
        except emulation.EmulationError as e:
            # skipped, not failed: nothing about the recipe is wrong, this host cannot run it. The
            # native cells still build; the run ends "incomplete" (exit 3), the summary says why.
            self.out.write(f"emulation: {e.arch} cells skipped: {e}\n")
            for j in self.jobs.values():
                if j.cell.arch == e.arch and self._starts_a_container(j):
                    cached = j.status == JobState.CACHED
                    j.status, j.reason = (
                        JobState.SKIPPED,
                        (
                            f"this host cannot run {j.cell.platform}: {e.cause}. Fix: {e.fix}"
                            + (
                                " (its cached tag is kept: only its supply documents could not be made)"
                                if cached
                                else ""
                            )
                        ),
                    )
                    j.ended = time.monotonic()
                    self.platform_skipped[j.name] = j.cell.platform
            self.plan.propagate()
            # another foreign architecture in the same run gets its own chance and its own reason
            if any(self._starts_a_container(j) and not emulation.is_native(j.cell.arch) for j in self.jobs.values()):
                self.ensure_emulation()

    def ensure_bases(self) -> None:
        by_base: dict[str, list[Job]] = {}
        for j in self.jobs.values():
            if not j.cell.parent and (j.status == JobState.QUEUED or self._documents_need_base(j)):
                by_base.setdefault(j.rendered.context.data["os"]["base_key"], []).append(j)
        locks = base_lock.load(self.root)
        for key, jobs in by_base.items():
            row = self.m.spec.os[jobs[0].cell.os]
            ref = jobs[0].rendered.context.data["os"]["base"]
            lock = base_lock.entry_for(locks, key, row.bootstrap is not None)
            try:
                self.base_refs[key], why = bases.resolve(
                    ref, row, lock, arch=jobs[0].cell.arch, log=lambda s: self.out.write(f"base: {s}\n")
                )
            except bootstrap.BootstrapError as e:
                why = f"base image {ref} unavailable: {str(e).splitlines()[0]}"
            if why:
                for j in jobs:
                    j.status, j.reason = JobState.FAILED, why
                    j.ended = time.monotonic()
        self.plan.propagate()

    def _documents_need_base(self, j: Job) -> bool:
        """A cached root tag that still needs its supply documents and whose labels do not say
        what it was built FROM (built before the record): its base is resolved as for a build."""
        if j.status != JobState.CACHED or self.supply is None or not self.supply.needs_step(j):
            return False
        info = engine.inspect_image(j.image)
        return info is not None and bases.recorded_base(info.labels) is None

    def check_space(self) -> None:
        todo = [j for j in self.jobs.values() if j.status == JobState.QUEUED]
        if todo:
            docker_build.check_space(len(todo), self.opts.min_free_gb)

    # -- build ---------------------------------------------------------------------------------
    def command(self, j: Job) -> tuple[list[str], dict[str, str]]:
        return docker_build.command(
            j,
            self.m.spec.naming.namespace,
            self.base_refs,
            self.ca,
            self.opts.network,
            no_cache=self.opts.no_cache or j.image in self._locked_images(),
            root=self.root,
        )

    def build_one(self, j: Job) -> None:
        logdir = self.opts.log_dir / self.run_id
        logdir.mkdir(parents=True, exist_ok=True)
        j.log = str(logdir / f"{j.name}.log")
        cmd, env = self.command(j)
        with self.lock:
            if self.interrupted:
                j.status, j.reason = JobState.INTERRUPTED, "not started: interrupted"
                return
            j.status, j.started = JobState.BUILDING, time.monotonic()
        self._stop_leftover_builds(j)
        # line-buffered: `tail -f` on a running build's log (and anything waiting for a step's
        # output) sees each line as BuildKit prints it, not in 8 KiB chunks
        with open(j.log, "w", buffering=1) as log:
            log.write("$ " + " ".join(cmd) + "\n\n")
            log.flush()
            proc = subprocess.Popen(
                cmd,
                cwd=self.root,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                start_new_session=True,
            )
            with self.lock:
                self.procs[j.name] = proc
            tail: list[str] = []
            assert proc.stdout is not None  # noqa: S101 -- stdout=PIPE
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
            # stop() sets it from the main thread while this build ran (mypy keeps the narrowing
            # of the check before the build: False)
            if self.interrupted:
                why = "build stopped: interrupted by Ctrl-C or SIGTERM (no tag was written)"  # type: ignore[unreachable]
                j.status, j.reason = JobState.INTERRUPTED, why
            elif rc != 0:
                j.status, j.reason = JobState.FAILED, docker_build.failure_reason(tail, rc)
                found = failures.classify_build(j.reason, tail, arch=j.cell.arch)
                j.failure_kind, j.fix = found.kind, found.fix
        if rc == 0 and not self.interrupted:
            # BUILT only after the supply chain: children start FROM this tag, SBOM included
            self._inspect(j)
            why = self._supply_chain(j)
            with self.lock:
                j.ended = time.monotonic()
                if why:
                    j.status, j.reason = JobState.FAILED, why
                else:
                    j.status = JobState.BUILT
            if j.status == JobState.BUILT:
                self._inspect(j)
                failpoints.hit("build.before-latest")  # the tag complete, its alias not yet moved
                engine.tag(j.image, j.image.rsplit(":", 1)[0] + ":" + ALIAS)

    def _supply_for_cached(self, j: Job) -> None:
        """A cached tag without this tag's documents (built before the supply step, or pulled):
        it goes through the same step, gates included, before anything is built FROM it. A cached
        tag the gates refused when it was built stays refused (issue 64): failed, not "cached", so
        nothing is built FROM it and --push does not publish it; until the allow-list changes,
        which judges it again here."""
        if self.supply is None:
            return
        if not self.supply.needs_step(j):
            why = self.supply.recorded_failure(j)
            if why:
                j.status, j.reason, j.failure_kind = JobState.FAILED, why, "recipe"
                j.ended = time.monotonic()
            else:
                # `latest` is the last step of a build: a run killed just before it left the tag
                # complete and the alias behind; this run finishes it (a no-op when it is there)
                engine.tag(j.image, j.image.rsplit(":", 1)[0] + ":" + ALIAS)
            return
        if self.supply.has_documents(j):
            what = "judged under another allow-list: judging it again"
        elif self.supply.files_complete(j):
            what = "documented, but the tag lacks its SBOM layer (a run stopped before attaching it): attaching it"
        else:
            what = "without supply-chain documents: making them"
        self.out.write(f"supply: {j.name}:{j.tag}: cached {what}\n")
        # the tag stays whatever the step says: the image is the one its recipe built, and
        # removing it would only make the next run rebuild what it already has
        why = self._supply_chain(j, remove_on_failure=False)
        if why:
            j.status, j.reason = JobState.FAILED, why
            j.ended = time.monotonic()
        else:
            self._inspect(j)
            engine.tag(j.image, j.image.rsplit(":", 1)[0] + ":" + ALIAS)

    def _supply_chain(self, j: Job, *, remove_on_failure: bool = True) -> str | None:
        """Documents, gates and the SBOM layer. The failure reason, or None; the failure's class
        (failures.py) is set on the job from what failed. A freshly built image that fails is
        untagged (a cell that failed keeps no name); a cached one keeps its tag."""
        if self.supply is None:
            return None
        j.last_line = "supply chain: inventory, SBOM, audits, size budget"
        t0 = time.monotonic()
        try:
            why = self.supply.after_build(j, j.size or 0)
            if why:
                j.failure_kind, j.fix = "recipe", None  # a gate's verdict on what the recipe made
        except Exception as e:  # noqa: BLE001 -- any failure of the step fails the cell, named and classed
            found = failures.classify_exception(e, arch=j.cell.arch)
            j.failure_kind, j.fix = found.kind, found.fix
            why = f"supply-chain step failed: {type(e).__name__}: {str(e)[:400]}" + (
                f" ({found.cause})" if found.cause else ""
            )
        j.supply_s = time.monotonic() - t0
        if why and remove_on_failure:
            engine.remove_image(j.image, force=True)
        return why

    def _inspect(self, j: Job) -> None:
        info = engine.inspect_image(j.image)
        if info is not None:
            j.image_id, j.size = info.id, info.size

    def run(self) -> int:
        self.preflight()
        if self.opts.dry_run:
            self.plan.describe(self.out, self.opts.jobs)
            return 0
        if not engine.available():
            raise TrainbaseError(
                "no Docker engine answers"
                + (f" at DOCKER_HOST={os.environ['DOCKER_HOST']}" if os.environ.get("DOCKER_HOST") else "")
                + ": run scripts/setup.sh (it starts one)"
            )
        self.check_space()
        with signals.as_interrupt():
            try:
                return self._run_stages()
            except KeyboardInterrupt as e:
                # a stage outside the build loop (bases, the supply step of cached tags, publishing):
                # its `finally`s have run (a supply container removed); stop any build and say so
                return self._stopped(e)

    def _stopped(self, e: BaseException) -> int:
        """Ctrl-C or SIGTERM: every running build stopped, every cell not yet done marked, and
        the run's record says which signal stopped it in which stage. 128 + the signal's number."""
        self.stop()
        self.stopped = {"signal": signals.name_of(e), "stage": self.stage}
        for j in self.jobs.values():
            if j.status in (JobState.QUEUED, JobState.STARTING):
                j.status, j.reason = JobState.INTERRUPTED, f"not started: {signals.name_of(e)} during {self.stage}"
        if self.stage == "publish":
            self.publish_error = (
                f"publish: STOPPED by {signals.name_of(e)}: the immutable tags pushed so far stay (a rerun "
                "skips them), nothing else was published"
            )
        return signals.exit_code(e)

    def _run_stages(self) -> int:
        self.stage = "bases"
        self.ensure_emulation()
        self.ensure_bases()
        if self.supply and self.supply.opts.locked:
            # --locked rebuilds every selected cell from its tag's lock, without cache: a cell
            # without a lock, or whose inputs moved (the base as resolved just now included),
            # is refused before anything starts
            for j in self.jobs.values():
                if j.selected and j.status == JobState.QUEUED:
                    why = self.supply.check_inputs(j)
                    if why:
                        j.status, j.reason = JobState.REFUSED, why
            self.plan.propagate()
        self.stage = "supply of cached tags"
        if self.supply is not None:
            from ..supply import chain

            chain.remove_leftovers(self.out)
        for j in self.jobs.values():
            if j.status == JobState.CACHED:
                self._inspect(j)
                self._supply_for_cached(j)
        self.plan.propagate()
        self.stage = "build"
        progress = Progress(self)
        progress.start()
        pool = ThreadPoolExecutor(max_workers=max(1, self.opts.jobs))
        running: dict[Future[None], Job] = {}
        stopped_by: BaseException | None = None
        try:
            while True:
                for j in self.plan.ready():
                    if len(running) >= self.opts.jobs:
                        break
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
                self.plan.propagate()
                progress.tick()
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (signals.Stopped)
            stopped_by = e
            self.stop()
            for f in list(running):
                # only waiting for each build to stop: how it ended is on its job already (build_one)
                with contextlib.suppress(Exception):
                    f.result(timeout=60)
            for j in self.jobs.values():
                if j.status in (JobState.QUEUED, JobState.STARTING):
                    j.status, j.reason = JobState.INTERRUPTED, "not started: interrupted"
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            progress.stop()
        if stopped_by is not None:
            return self._stopped(stopped_by)
        if self.opts.push and not self.interrupted:
            self.stage = "publish"
            self.push()
        self.stage = "done"
        return self.exit_code()

    def exit_code(self) -> int:
        """0: every cell usable. 1: a cell failed, was refused, or publishing failed. 3
        (INCOMPLETE): every cell this host can build is usable, but the cells of a platform it
        cannot run were skipped (they, and only they, are listed in the summary with the fix)."""
        bad = [j for j in self.jobs.values() if j.status.bad]
        if self.publish_error or any(j.name not in self.incomplete_cells() for j in bad):
            return 1
        return INCOMPLETE if bad else 0

    def incomplete_cells(self) -> set[str]:
        """The cells skipped because this host cannot run their platform, and every cell built on one."""
        out = set(self.platform_skipped)
        grew = True
        while grew:
            more = {j.name for j in self.jobs.values() if j.cell.parent in out and j.status == JobState.SKIPPED}
            grew = not more <= out
            out |= more
        return out

    def _stop_leftover_builds(self, j: Job) -> None:
        """A `docker build` of this very tag still running from a run that was killed (kill -9
        of build.py leaves it: it runs in its own session so that Ctrl-C reaches it only through
        stop()). Both would build and tag the same name; the leftover's result would carry no
        documents. It is stopped, said, before this run builds."""
        for pid in leftover_builds(j.image, os.getpid()):
            self.out.write(
                f"build: {j.name}: a docker build of {j.tag} left by a killed run (pid {pid}): stopping it\n"
            )
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), signal.SIGINT)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and processes.pid_alive(pid):
                time.sleep(0.2)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Ctrl-C: stop every running build (SIGINT to its process group, then SIGKILL).
        docker build tags only after success, so nothing half-built keeps a tag."""
        with self.lock:
            self.interrupted = True
            procs = list(self.procs.values())
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGINT)
        deadline = time.monotonic() + 20
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)

    # -- publish --------------------------------------------------------------------------------
    def push(self) -> None:
        try:
            wanted = platforms.expected(self.m, self.root) if self.opts.stage else None
            attester = None
            if self.opts.sign_key is not None:
                from ..deliver.attest import Attester

                attester = Attester(
                    self.opts.registry or "",
                    self.opts.supply.dir if self.opts.supply else self.root / "reports" / "supply",
                    self.opts.sign_key,
                    self.out,
                )
            publish.publish(
                self.jobs.values(),
                self.opts.registry or "",
                engine.tag,
                out=self.out,
                zstd_twin=self.opts.zstd_twin,
                platforms=wanted,
                attest=attester.attach if attester else None,
            )
        except TrainbaseError as e:  # the registry's answer, or a cell that cannot be attested
            self.publish_error = str(e)
            self.out.write(f"publish: STOPPED: {e}\n")


def leftover_builds(image: str, me: int, proc: Path = Path("/proc")) -> list[int]:
    """The pids of `docker build` processes tagging IMAGE that no live trainbase run owns: not
    this process's, and re-parented (to init or a subreaper) because the run that started them
    was killed. One whose parent is another live run (another checkout on this engine) is that
    run's build, not a leftover."""
    found = []
    for d in proc.glob("[0-9]*"):
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if not args or Path(args[0]).name != "docker" or "build" not in args[1:3]:
            continue
        tags = {args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-t", "--tag")}
        tags |= {a.split("=", 1)[1] for a in args if a.startswith("--tag=")}
        if image in tags and ppid != me and not _a_run(proc / str(ppid)):
            found.append(int(d.name))
    return sorted(found)


def _a_run(parent: Path) -> bool:
    """Whether the process at PARENT (a /proc entry) is a live trainbase run (build.py, or the
    package's entry point)."""
    try:
        argv = parent.joinpath("cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a.endswith(b"build.py") or a.startswith(b"trainbase") for a in argv)
