"""Supply chain of every built cell: what it was built from (an input lock), what it has (an
inventory and a CycloneDX SBOM, attached to the image as a file and a label), whether it is
patched (audits as gates), whether it fits (size and waste budgets), and what changed since
the cell's previous build (release notes). Documents land per tag:

    <supply dir>/<cell>/<tag>/{inputs.lock.json, inventory.json, sbom.cdx.json,
                               audit.json, budget.json, release-notes.md}

A gate that fails fails the cell, and its tag is removed: nothing unaudited or over budget
keeps a name. `--locked` rebuilds a cell without cache and fails when any input or output
differs from the tag's lock (base, downloads, pip locks, patches; then installed packages,
manifest and SBOM)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from trainbase_common import engine, failpoints, processes, safe_io

from ..build import bases
from ..build.plan import Job
from ..errors import TrainbaseError
from ..render.recipes import Rendered
from . import audit, budget, inventory_reader, release_notes, sbom
from .inventory import Inventory

SBOM_DIR = "/etc/trainbase/sbom"  # one file per cell: a child image keeps its parents' SBOMs
LOCK_SCHEMA = 1
VERDICT = "verdict.json"  # the gates' verdict on the tag: ok, failures, the allow-list it was judged under


@dataclass
class SupplyOptions:
    dir: Path = Path("reports/supply")
    allowlist: Path = Path("audit-allowlist.yaml")
    locked: bool = False
    python_audit: str = "auto"  # auto | require | warn | off
    os_audit: bool = True
    waste: bool = True
    today: dt.date = field(default_factory=dt.date.today)


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _file_sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else "missing"


class SupplyChain:
    def __init__(
        self,
        root: Path,
        opts: SupplyOptions,
        base_refs: dict[str, str],
        rendered: dict[str, Any],
        network: str | None = None,
    ):
        self.root, self.opts, self.base_refs, self.rendered = root, opts, base_refs, rendered
        self.network = network  # the builds' network: the audit's apt-get update goes out the same way
        self.allowlist = (
            audit.load_allowlist(root / opts.allowlist)
            if (root / opts.allowlist).exists()
            else audit.load_allowlist(None)
        )
        self.tools = inventory_reader.tools_digest(root)
        self.allowlist_sha256 = _file_sha256(root / opts.allowlist)

    # -- what the build reads --------------------------------------------------------------
    def cell_dir(self, j: Job) -> Path:
        return self.opts.dir / j.name / j.tag

    def artifacts(self, j: Job) -> list[dict[str, Any]]:
        """Every pinned download of the cell and of the cells it is built FROM."""
        out: list[dict[str, Any]] = []
        r: Rendered | None = j.rendered
        while r is not None:
            for key in r.context.artifacts:
                a = _artifact_by_key(r.context.data, key)
                if a:
                    out.append(a)
            r = self.rendered[r.cell.parent] if r.cell.parent else None
        return sorted(out, key=lambda a: a["key"])

    def sources(self, j: Job) -> list[dict[str, Any]]:
        """Every pinned source tree built into the cell and the cells it is built FROM (its
        repository, commit and tree id: what the build verified the archive against)."""
        out: dict[str, dict[str, Any]] = {}
        r: Rendered | None = j.rendered
        while r is not None:
            for key in r.context.sources:
                found = _source_by_key(r.context.data, key)
                if found:
                    out[key] = found
            r = self.rendered[r.cell.parent] if r.cell.parent else None
        return [out[k] for k in sorted(out)]

    def inputs(self, j: Job) -> dict[str, Any]:
        """The inputs a rebuild must find unchanged: base identity, downloads, pip locks, patches."""
        ctx = j.rendered.context
        os_base = ctx.data["os"]["base"]
        base_ref = self.base_refs.get(os_base, os_base)
        return {
            "base": bases.base_identity(base_ref) if not j.cell.parent else {"parent": j.cell.parent},
            "artifacts": {a["key"]: {"url": a["url"], "sha256": a["sha256"]} for a in self.artifacts(j)},
            "sources": {
                s["key"]: {"repository": s["repository"], "commit": s["commit"], "tree": s["tree"]}
                for s in self.sources(j)
            },
            "pip_locks": {ls.path: _file_sha256(self.root / ls.path) for ls in ctx.locks},
            "patches": (
                {ctx.data["framework"]["patch"]["file"]: ctx.data["framework"]["patch"]["sha256"]}
                if ctx.data.get("framework") and ctx.data["framework"].get("patch")
                else {}
            ),
            "parent_tag": self.rendered[j.parent].tag if j.parent else None,
        }

    def has_documents(self, j: Job) -> bool:
        """The tag's documents are complete: its files, and -- for a tag the gates passed -- the
        SBOM layer on the tag itself (its label names the recorded SBOM's digest). The files are
        written before the layer is attached, so a kill between the two (issue 64: kill -9 in
        the supply step) left files that said "done" on a tag without its SBOM, which no rerun
        completed and --push published. A refused tag never gets the layer: its files suffice."""
        if not self.files_complete(j):
            return False
        v = self._verdict(j)
        if v is not None and not v.get("ok"):
            return True
        return self.sbom_attached(j)

    def files_complete(self, j: Job) -> bool:
        d = self.cell_dir(j)
        return all((d / f).exists() for f in ("inputs.lock.json", "sbom.cdx.json", "audit.json", "budget.json"))

    def sbom_attached(self, j: Job) -> bool:
        """Whether the tag carries the SBOM its inputs.lock.json records (the label the SBOM layer sets)."""
        try:
            want = safe_io.load_json_object(self.cell_dir(j) / "inputs.lock.json").get("outputs", {}).get("sbom_sha256")
        except (OSError, safe_io.InputError):
            return False
        info = engine.inspect_image(j.image)
        return bool(want) and info is not None and info.labels.get("io.trainbase.sbom.sha256") == want

    # -- the verdict of the gates, kept with the tag (issue 64) --------------------------------
    def needs_step(self, j: Job) -> bool:
        """Whether a cached tag goes through the supply step this run: it has no documents, or
        its recorded verdict was given under another allow-list (which may now accept or refuse)."""
        return not self.has_documents(j) or self._verdict(j) is None

    def recorded_failure(self, j: Job) -> str | None:
        """Why the gates refused this tag when it was built (or documented), or None when they
        passed it; a failed gate stays failed on every later run, cached or not, until the recipe
        (a new tag) or the allow-list changes."""
        v = self._verdict(j)
        if v is None or v.get("ok"):
            return None
        return f"{j.name}: the supply gate refused {j.name}:{j.tag} when it was built: " + " | ".join(
            v.get("failures") or ["(no reason recorded)"]
        )

    def _verdict(self, j: Job) -> dict[str, Any] | None:
        """verdict.json of the tag, while the allow-list it was judged under is today's; a tag
        documented before the record: the verdicts of its audit.json and budget.json."""
        d = self.cell_dir(j)
        try:
            v = safe_io.load_json_object(d / VERDICT)
        except FileNotFoundError:
            v = None
        except safe_io.InputError:
            return None  # unreadable: judge again
        if v is not None:
            return v if v.get("allowlist_sha256") == self.allowlist_sha256 else None
        failures = []
        for name in ("audit.json", "budget.json"):
            try:
                doc = safe_io.load_json_object(d / name)
            except (FileNotFoundError, safe_io.InputError):
                return None
            if not doc.get("ok"):
                failures.append(str(doc.get("message") or f"{name}: not ok"))
        return {"ok": not failures, "failures": failures}

    def _record_verdict(self, j: Job, failures: list[str]) -> None:
        doc = {
            "ok": not failures,
            "failures": failures,
            "cell": j.name,
            "tag": j.tag,
            "recipe": j.rendered.recipe,
            "allowlist": str(self.opts.allowlist),
            "allowlist_sha256": self.allowlist_sha256,
        }
        safe_io.atomic_write(self.cell_dir(j) / VERDICT, json.dumps(doc, indent=2, sort_keys=True) + "\n")

    # -- --locked ----------------------------------------------------------------------------
    def lock_of(self, j: Job) -> dict[str, Any] | None:
        p = self.cell_dir(j) / "inputs.lock.json"
        if not p.exists():
            return None
        try:  # empty or truncated: what a kill or a full disk left before writes were atomic
            lock = safe_io.load_json_object(p)
        except safe_io.InputError as e:
            raise TrainbaseError(f"--locked: {e}: rebuild the cell once without --locked") from None
        if not isinstance(lock.get("inputs"), dict) or not isinstance(lock.get("outputs"), dict):
            raise TrainbaseError(f"--locked: {p}: not an input lock (no inputs/outputs objects)")
        return lock

    def check_inputs(self, j: Job) -> str | None:
        """--locked, before building: the reason to refuse the cell, or None."""
        lock = self.lock_of(j)
        if lock is None:
            return (
                f"--locked: no input lock for {j.name}:{j.tag} under {self.opts.dir} "
                "(build it once without --locked; a changed recipe is a new tag with no lock)"
            )
        return _diff("input", lock["inputs"], self.inputs(j))

    # -- after a build -----------------------------------------------------------------------
    def after_build(self, j: Job, size_bytes: int) -> str | None:
        """Inventory, SBOM, gates, documents; the failure reason, or None after attaching the
        SBOM to the image."""
        d = self.cell_dir(j)
        d.mkdir(parents=True, exist_ok=True)
        inputs = self.inputs(j)
        recorded = bases.recorded_base(_labels(j.image))
        if recorded and not j.cell.parent:
            inputs["base"] = recorded  # what this image was built FROM, not what resolves today
        base = recorded or (inputs["base"] if not j.cell.parent else self._parent_base(j))
        inv = inventory_reader.read(
            j.image, j.name, j.tag, base, inventory_reader.components_of(self.artifacts(j), self.tools, self.sources(j))
        )
        text = sbom.to_cyclonedx(inv)
        sbom.validate(text)
        safe_io.atomic_write(d / "inventory.json", json.dumps(inv.to_json(), indent=2, sort_keys=True) + "\n")
        safe_io.atomic_write(d / "sbom.cdx.json", text)
        failures = []
        verdict, security = self._audit(j, inv)
        safe_io.atomic_write(d / "audit.json", json.dumps(verdict, indent=2, sort_keys=True) + "\n")
        if not verdict["ok"]:
            failures.append(verdict["message"])
        fits = self._budget(j, inv, size_bytes)
        safe_io.atomic_write(d / "budget.json", json.dumps(fits, indent=2, sort_keys=True) + "\n")
        if not fits["ok"]:
            failures.append(fits["message"])
        lock: dict[str, Any] = {
            "schema": LOCK_SCHEMA,
            "cell": j.name,
            "tag": j.tag,
            "recipe": j.rendered.recipe,
            "inputs": inputs,
            "outputs": {
                "deb": {p.name: p.version for p in inv.of_kind("deb")},
                "pypi": {p.name: p.version for p in inv.of_kind("pypi")},
                "manifest_sha256": _sha256_text(json.dumps(inv.manifest, sort_keys=True)),
                "sbom_sha256": sbom.sbom_digest(text),
            },
        }
        if self.opts.locked:
            old = self.lock_of(j)
            changed = _diff("output", old["outputs"], lock["outputs"]) if old else "--locked: the lock vanished"
            if changed:
                failures.append(changed + " (the rebuild did not reproduce the locked image)")
        else:
            safe_io.atomic_write(d / "inputs.lock.json", json.dumps(lock, indent=2, sort_keys=True) + "\n")
        previous = self._previous(j)
        # what the previous build still had open and this one may fix, and what stays open
        before = self._previous_doc(j, "audit.json").get("open", [])
        safe_io.atomic_write(d / "release-notes.md", release_notes.release_notes(inv, previous, before + security))
        self._record_verdict(j, failures)  # the lock above is written either way: this says whether it passed
        if failures:
            return f"{j.name}: " + " | ".join(failures)
        if _labels(j.image).get("io.trainbase.sbom.sha256") != sbom.sbom_digest(text):
            failpoints.hit("supply.before-sbom-layer")  # documents written, the layer not yet
            self._attach(j, text, base)  # not again on a tag that already carries this SBOM (pulled)
        return None

    def _parent_base(self, j: Job) -> dict[str, str]:
        p = self.opts.dir / j.parent / self.rendered[j.parent].tag / "inventory.json" if j.parent else None
        if not (p and p.exists()):
            return {"ref": "", "identity": "", "how": "parent"}
        base: dict[str, str] = safe_io.load_record(p, "a cell's inventory (the supply-chain step's)", {"base": dict})[
            "base"
        ]
        return base

    def _previous_doc(self, j: Job, name: str) -> dict[str, Any]:
        """A document of the cell's most recent other tag: what the release notes compare to."""
        others = [p for p in (self.opts.dir / j.name).glob(f"*/{name}") if p.parent.name != j.tag]
        return safe_io.load_json_object(max(others, key=lambda p: p.stat().st_mtime)) if others else {}

    def _previous(self, j: Job) -> Inventory | None:
        doc = self._previous_doc(j, "inventory.json")
        return Inventory.from_json(doc) if doc else None

    def _audit(self, j: Job, inv: Inventory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        findings: list[audit.Finding] = []
        unaudited: list[tuple[str, str]] = []
        if self.opts.python_audit != "off":
            py, unaudited = audit.pip_audit(inv.of_kind("pypi"))
            findings += py
        if self.opts.os_audit:
            findings += audit.apt_security_findings(_run_in(j.image, audit.APT_SECURITY_COMMAND, 300, self.network))
        policy = self.opts.python_audit
        if policy == "auto":  # require data where the vulnerability service answers, say so where it cannot
            policy = "warn" if unaudited and len(unaudited) >= len(inv.of_kind("pypi")) else "require"
        v = audit.evaluate(
            findings,
            self.allowlist,
            j.name,
            self.opts.today,
            unaudited=unaudited,
            policy="require" if policy == "require" else "warn",
        )  # off: warn, unaudited
        security = [
            {
                "package": f.package,
                "installed": f.installed,
                "fixed": f.fixed,
                "advisory": ", ".join(f.ids) or f.summary,
            }
            for f in findings
        ]
        return {
            "ok": v.ok,
            "message": v.message(),
            "policy": policy,
            "findings": len(findings),
            "blocked": len(v.blocked),
            "allowed": len(v.allowed),
            "expired": len(v.expired),
            "unaudited": len(unaudited),
            "open": security,
        }, security

    def _budget(self, j: Job, inv: Inventory, size_bytes: int) -> dict[str, Any]:
        from trainbase_common import layers

        budget_gb = float(inv.manifest.get("size_budget_gb") or 0)
        if budget_gb <= 0:  # the schema requires one: a manifest without it is not trainbase's
            raise ValueError(f"{j.name}: the image's manifest names no size_budget_gb")
        history = engine.image_history(j.image)
        dirs = budget.largest_dirs(_run_in(j.image, budget.LARGEST_DIRS_COMMAND, 300, self.network))
        waste = layers.layer_waste(layers.scan_layers(j.image, lambda p, s: False)) if self.opts.waste else None
        v = budget.check_budget(j.name, size_bytes, budget_gb, history, dirs, waste)
        return {
            "ok": not (v.over_size or v.over_waste),
            "message": v.message(),
            "size_bytes": size_bytes,
            "budget_gb": budget_gb,
            "waste_bytes": waste.total if waste else None,
        }

    def _attach(self, j: Job, text: str, base: dict[str, str]) -> None:
        """The SBOM into the image as a file, with labels naming it: one small layer on top of
        the recipe's image, under the same tag."""
        with tempfile.TemporaryDirectory(prefix="tb-sbom-") as ctx:
            Path(ctx, "sbom.cdx.json").write_text(text)
            Path(ctx, "Dockerfile").write_text(
                f"FROM {j.image}\nCOPY sbom.cdx.json {SBOM_DIR}/{j.name}.cdx.json\n"
                f'LABEL io.trainbase.sbom="{SBOM_DIR}/{j.name}.cdx.json" '
                f'io.trainbase.sbom.sha256="{sbom.sbom_digest(text)}" '
                + " ".join(f'{k}="{v}"' for k, v in bases.base_labels(base).items())
                + "\n"
            )
            engine.build_legacy(ctx, j.image, {})


def _artifact_by_key(data: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The artifact dict the context holds for ``key`` (mpi, ucx, python installer, ib key, sdist)."""
    cands = [
        data["mpi"].get("artifact"),
        data["ucx"].get("artifact"),
        data["python"].get("installer"),
        data["ib"].get("key_artifact"),
        (data.get("framework") or {}).get("sdist"),
    ]
    return next((a for a in cands if a and a["key"] == key), None)


def _source_by_key(data: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The pinned source a block of the context builds from (Facts.source: gdrcopy's ...)."""
    cands = [v.get("source") for v in data.values() if isinstance(v, dict)]
    return next((c for c in cands if isinstance(c, dict) and c.get("key") == key), None)


OWNER = "io.trainbase.supply.owner"  # HOST:PID of the run that started a supply container


def remove_leftovers(out: TextIO, host: str | None = None, alive: Callable[[int], bool] | None = None) -> list[str]:
    """Remove the supply containers of runs on this host that are gone (a kill -9 skips the
    `finally` that removes them): `sleep infinity` containers of a multi-GB image that nothing
    would ever stop. Those of a live run, or of another host on a shared engine, are left. The
    names removed, each said."""
    host = host or socket.gethostname()
    alive = alive or processes.pid_alive
    removed: list[str] = []
    try:
        leftovers = engine.labelled_containers("io.trainbase.supply")
    except engine.EngineError as e:  # housekeeping: the run goes on, said
        out.write(f"supply: could not list leftover supply containers: {e}\n")
        return removed
    for cid, name, labels in leftovers:
        owner_host, _, pid = labels.get(OWNER, "").rpartition(":")
        if owner_host != host or not pid.isdigit() or alive(int(pid)):
            continue
        engine.remove_container(cid)
        out.write(f"supply: removed {name}, left by a run that was killed (pid {pid})\n")
        removed.append(name)
    return removed


def _run_in(image: str, script: str, timeout: int, network: str | None = None) -> str:
    """Run ``script`` in a throwaway container of ``image``; its stdout (the image is untouched)."""
    import uuid

    cid = engine.run_detached(
        image,
        ["sleep", "infinity"],
        name=f"tb-supply-{uuid.uuid4().hex[:8]}",
        # who started it: a run killed with -9 cannot remove it; the next run does (remove_leftovers)
        labels={"io.trainbase.supply": "1", OWNER: f"{socket.gethostname()}:{os.getpid()}"},
        opts=engine.RunOptions(init=False),
        network=network,
    )
    try:
        r = engine.exec_in(cid, ["timeout", str(timeout), "/bin/sh", "-c", script])
    finally:
        engine.remove_container(cid)
    if r.returncode != 0:
        raise RuntimeError(f"`{script[:80]}` in {image} exited {r.returncode}: {r.stderr.strip()[-300:]}")
    return r.stdout


def _diff(what: str, locked: dict[str, Any], now: dict[str, Any], path: str = "") -> str | None:
    """The first differences between a lock and now, named: "input base.identity: locked X, now Y"."""
    out = []
    for k in sorted(set(locked) | set(now)):
        a, b = locked.get(k), now.get(k)
        where = f"{path}.{k}" if path else k
        if isinstance(a, dict) and isinstance(b, dict):
            sub = _diff(what, a, b, where)
            if sub:
                out.append(sub)
        elif a != b:
            out.append(f"{what} {where}: locked {a!r}, now {b!r}")
    return "; ".join(out[:8]) + (f"; and {len(out) - 8} more" if len(out) > 8 else "") if out else None


def _labels(image: str) -> dict[str, str]:
    """The labels of IMAGE, which the step reads from the engine: a tag that left the engine
    since the plan was made (pruned, removed by hand) is named, not an AttributeError."""
    info = engine.inspect_image(image)
    if info is None:
        raise TrainbaseError(f"{image} is no longer in the engine (removed since this run began?)")
    return info.labels
