"""The image catalogue (docs/images.md and its JSON twin docs/images.json): one row per cell the
matrix builds, with what a platform engineer picks an image by -- OS, Python, CUDA toolkit,
cuDNN, NCCL, MPI and UCX, the InfiniBand userspace, frameworks and their key packages, the GPU
architectures compiled for, the oldest driver that runs it, the platform -- and, where a build
was recorded, its measured size, where it was built and which conformance tiers passed.

Everything but the record comes from what the render already wrote (images/<cell>/manifest.json)
and matrix.yaml, so the page cannot say what the image does not hold. The record
(docs/catalogue-record.json) is written from a real run's reports: `build.py catalogue
--report reports/build.json --junitxml reports/junit.xml --where "..."`; a cell without one says
"not built yet" instead of a figure. The page is drift-checked by tests/unit/test_catalogue.py,
as the failure table is: edit the sources and rerun `build.py catalogue` (or `build.py render`), never the page.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from trainbase_common import gpu_code, safe_io, states
from trainbase_common.driver_promise import DriverPromise, promise_for

from ..define import base_lock
from ..define.base_lock import BaseLock
from ..define.matrix import Cell, Matrix
from ..errors import TrainbaseError

PAGE = Path("docs/images.md")
TWIN = Path("docs/images.json")
RECORD = Path("docs/catalogue-record.json")
GENERATOR = "build.py catalogue"
TIER_ORDER = ("static", "cpu", "multinode", "azureml", "runtime", "gpu", "fabric")
FRAMEWORK_ORDER = ("none", "pytorch", "deepspeed", "horovod", "tensorflow")


@dataclass
class Row:
    name: str
    platform: str
    os: str
    base: str
    python: str
    cuda: str
    cuda_from: str
    cudnn: str
    nccl: str
    # the NCCL network plugin NCCL loads by itself, and the fabric it serves ("-": NCCL's own transports only)
    net_plugin: str
    mpi: str
    ucx: str
    ib: str
    frameworks: dict[str, dict[str, str]]
    gpu_architectures: list[str]  # the CUDA row's: what trainbase compiles device code for
    min_driver: str  # the oldest driver the image starts on natively (trainbase_common.driver_promise)
    parent: str | None
    built: dict[str, Any] | None = None  # the record: size_bytes, where, date, tiers, tag
    profiles: list[str] = field(default_factory=list)
    tag: str = ""  # the recipe tag the sources give the cell now
    # the older driver branches it also starts on, on data-center GPUs, through the forward-compatibility
    # libraries it carries (the nvidia/cuda bases'); none for an image without them
    forward_compat_branches: list[int] = field(default_factory=list)
    # the row's GPUs the image is built for, each with how its code runs there ("machine code", or
    # "PTX (tensorflow)": JIT-compiled from a part's PTX at first use), and those it is not, with why
    # (trainbase_common.gpu_code over the manifest's gpu_code and gpu_refused)
    built_for: list[dict[str, str]] = field(default_factory=list)
    not_built_for: dict[str, str] = field(default_factory=dict)
    # the GPUs a recorded GPU tier passed on (the record's tested_on), or "" where none has
    tested_on: str = ""

    @property
    def promise(self) -> DriverPromise:
        native = self.min_driver.removeprefix(">= ") if self.min_driver.startswith(">= ") else None
        return DriverPromise(self.cuda_row, native, tuple(self.forward_compat_branches))

    @property
    def cuda_row(self) -> str:
        return ".".join(self.cuda.split(".")[:2])

    @property
    def recorded_at_another_recipe(self) -> bool:
        """The record measured an image whose recipe (Dockerfile, locks, in-image tools) has changed
        since: its figures describe the last build, not what a build of this checkout gives."""
        return bool(self.built and self.tag and self.built.get("tag") and self.built["tag"] != self.tag)

    @property
    def framework(self) -> str:
        names = list(self.frameworks)
        return names[0] if names else "none"


def _version(component: dict[str, Any] | None, key: str = "version") -> str:
    value = (component or {}).get(key)
    return str(value) if value not in (None, "") else "-"


def promise_of(manifest: dict[str, Any], locks: dict[str, BaseLock] | None = None) -> DriverPromise:
    """The drivers an image starts on, from its manifest's CUDA and base: the one evaluation the
    catalogue's driver column, docs/images.json and the docs' driver sentences (their tests) say.
    The base's requirement is its lock's recorded Env where locks/bases.json has one."""
    comp = manifest.get("components", {})
    base = str(comp.get("os", {}).get("base", ""))
    lock = (locks or {}).get(base.partition("@")[0])
    return promise_for(str(comp.get("cuda", {}).get("version", "0.0")), base, lock.env if lock else None)


def row_for(m: Matrix, cell: Cell, manifest: dict[str, Any], locks: dict[str, BaseLock] | None = None) -> Row:
    comp: dict[str, Any] = manifest.get("components", {})
    cuda = comp.get("cuda", {})
    mpi = comp.get("mpi", {})
    ib = comp.get("ib", {})
    ib_text = str(ib.get("kind", "-")) + (f" {ib['version']}" if ib.get("version") else "")
    if cell.ib == "inbox":
        ib_text += " (the distro's, inbox)"
    promise = promise_of(manifest, locks)
    architectures = list(m.spec.cuda[cell.cuda].architectures or [])
    served, not_for = gpu_code.built_for(
        architectures, manifest.get("gpu_code") or {}, manifest.get("gpu_refused") or {}
    )
    return Row(
        name=cell.name,
        platform=cell.platform,
        os=str(comp.get("os", {}).get("id", cell.os)),
        base=str(comp.get("os", {}).get("base", "-")),
        python=_version(comp.get("python")),
        cuda=_version(cuda, "toolkit") if cuda.get("toolkit") else _version(cuda),
        cuda_from=str(cuda.get("from", "-")),
        cudnn=_version(comp.get("cudnn")),
        # with nccl-tests' release where the image carries its benchmarks (all_reduce_perf ...)
        nccl=_version(comp.get("nccl"))
        + (f" + nccl-tests {comp['nccl_tests']['version']}" if comp.get("nccl_tests") else ""),
        net_plugin=(
            f"{comp['nccl_net_plugin']['name']} {comp['nccl_net_plugin']['version']} ({comp['nccl_net_plugin'].get('fabric', '?')})"
            if comp.get("nccl_net_plugin")
            else "-"
        ),
        mpi=f"{mpi.get('kind', '-')} {mpi.get('version', '')}".strip()
        + (f" ({mpi['install']})" if mpi.get("install") else ""),
        # the UCX the MPI loads (a wheel's bundled copy where it has one), as the label says
        ucx=_version(mpi.get("ucx") or comp.get("ucx")),
        ib=ib_text,
        frameworks={
            k: {p: str(v) for p, v in sorted(pkgs.items())}
            for k, pkgs in (manifest.get("framework_packages") or {}).items()
        },
        gpu_architectures=architectures,
        built_for=[{"architecture": arch, "code": how} for arch, how in served],
        not_built_for=not_for,
        min_driver=promise.min_driver,
        parent=manifest.get("parent"),
        profiles=sorted(cell.profiles),
        forward_compat_branches=list(promise.forward_compat),
    )


def rows(m: Matrix, root: Path, record: dict[str, Any], tags: dict[str, str] | None = None) -> list[Row]:
    out = []
    locks = base_lock.load(root)
    for cell in m.included:
        path = root / "images" / cell.name / "manifest.json"
        if not path.is_file():
            continue  # a cell refused at render time has no page row: --explain says why
        r = row_for(m, cell, json.loads(path.read_text()), locks)
        r.built = record.get("cells", {}).get(cell.name)
        r.tested_on = str((r.built or {}).get("tested_on") or "")
        r.tag = (tags or {}).get(cell.name, "")
        out.append(r)
    return out


# -- the record of real runs ----------------------------------------------------------------------
def _junit_root(junit_xml: Path) -> ET.Element:
    try:
        root = ET.parse(junit_xml).getroot()  # noqa: S314 -- see the import
    except ET.ParseError as e:
        (line, col) = e.position
        cut = "cut short" if "no element found" in str(e) or "unclosed token" in str(e) else "not XML"
        raise TrainbaseError(
            f"{junit_xml}: {cut} (line {line}, column {col}): not a JUnit report (pytest --junitxml)"
        ) from None
    except OSError as e:
        raise TrainbaseError(f"{junit_xml}: {e.strerror or e}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise TrainbaseError(f"{junit_xml}: not a JUnit report (pytest --junitxml): its root element is <{root.tag}>")
    return root


def gpus_from_junit(junit_xml: Path) -> str:
    """The GPUs the run's host handed its containers, as the suite recorded them (its test-suite
    property host.gpus: "8 x NVIDIA H100 80GB HBM3 (9.0)"); "" for a run without GPUs."""
    for prop in _junit_root(junit_xml).iter("property"):
        if prop.get("name") == "host.gpus":
            return prop.get("value") or ""
    return ""


def tiers_from_junit(junit_xml: Path) -> dict[str, dict[str, dict[str, int]]]:
    """image name -> tier -> {passed, failed, skipped}, from the suite's JUnit (each case carries
    its image and tier as properties)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    root = _junit_root(junit_xml)
    for case in root.iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        image, tier = props.get("image"), props.get("tier")
        if not image or not tier:
            continue
        name = image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
        outcome = (
            "failed"
            if case.find("failure") is not None or case.find("error") is not None
            else "skipped"
            if case.find("skipped") is not None
            else "passed"
        )
        counts = out.setdefault(name, {}).setdefault(tier, {"passed": 0, "failed": 0, "skipped": 0})
        counts[outcome] += 1
    return out


def record_run(
    record: dict[str, Any],
    build_report: dict[str, Any],
    tiers: dict[str, dict[str, dict[str, int]]],
    where: str,
    day: str,
    gpus: str = "",
) -> list[str]:
    """Fold one run's reports into the record: each usable cell's size and id, where and when,
    its tiers' counts, and the GPUs its GPU tier passed on. Returns the cells recorded."""
    cells = record.setdefault("cells", {})
    done = []
    for c in build_report.get("cells", []):
        if c.get("status") not in ("built", "cached") or not c.get("size_bytes"):
            continue
        cells[c["name"]] = {
            "tag": c.get("tag"),
            "size_bytes": c["size_bytes"],
            "image_id": c.get("image_id"),
            "where": where,
            "date": day,
            "tiers": tiers.get(c["name"], {}),
        }
        gpu_tier = tiers.get(c["name"], {}).get("gpu") or {}
        if gpus and gpu_tier.get("passed") and not gpu_tier.get("failed"):
            cells[c["name"]]["tested_on"] = gpus  # only a GPU tier that ran, and passed, tested a GPU
        done.append(c["name"])
    return done


def load_record(root: Path) -> dict[str, Any]:
    path = root / RECORD
    if not path.is_file():
        return {"cells": {}}
    try:  # a truncated record must stop render with its name, not a JSONDecodeError
        record = safe_io.load_json_object(path)
    except safe_io.InputError as e:
        raise TrainbaseError(f"{RECORD}: {str(e).removeprefix(str(path) + ': ')} (restore it from git)") from None
    if not isinstance(record.get("cells", {}), dict):
        raise TrainbaseError(f"{RECORD}: cells must be a JSON object")
    bad = next((name for name, c in record.get("cells", {}).items() if not isinstance(c, dict)), None)
    if bad is not None:
        raise TrainbaseError(f"{RECORD}: cells[{bad!r}] is no cell's record (restore it from git)")
    return record


# -- the page -------------------------------------------------------------------------------------
def _size(r: Row) -> str:
    if not r.built:
        return "not built yet"
    size = f"{r.built['size_bytes'] / 1e9:.2f} GB"
    # said beside the figure, so nobody takes it for the current recipe's
    return f"{size} (as {r.built['tag']}; the recipe is {r.tag} since)" if r.recorded_at_another_recipe else size


def _tiers(r: Row) -> str:
    if not r.built:
        return "-"
    said = []
    for tier in TIER_ORDER:
        n = (r.built.get("tiers") or {}).get(tier)
        if not n or not (n["passed"] or n["failed"]):
            continue  # not run, or every check skipped (a gpu tier on a host without a GPU): not passed
        said.append(f"{tier} {'FAILED ' + str(n['failed']) if n['failed'] else 'passed'} ({n['passed']})")
    return "; ".join(said) or "built, no tier recorded"


def _built_for(r: Row, notes: dict[str, int]) -> str:
    """The row's GPUs the image serves ("8.0, 8.6, 8.9, 9.0 (PTX: tensorflow)") and those it does
    not, with the number of the note that says why (a reason shared by rows is said once)."""
    said = ", ".join(
        b["architecture"] + (f" ({b['code'].replace(' (', ': ', 1)}" if b["code"] != gpu_code.MACHINE_CODE else "")
        for b in r.built_for
    )
    by_reason: dict[int, list[str]] = {}
    for arch, why in r.not_built_for.items():
        by_reason.setdefault(notes.setdefault(why, len(notes) + 1), []).append(arch)
    refused = "; ".join(f"not {', '.join(archs)} (note {n})" for n, archs in sorted(by_reason.items()))
    return "; ".join(x for x in (said or "-", refused) if x)


def _tested_on(r: Row) -> str:
    if r.tested_on and r.built:
        return f"{r.tested_on} ({r.built['where']}, {r.built['date']})"
    return "no GPU tier recorded"


def _frameworks(r: Row) -> str:
    if not r.frameworks:
        return "-"
    return "; ".join(", ".join(f"{p} {v}" for p, v in pkgs.items()) for pkgs in r.frameworks.values())


def _group(r: Row) -> tuple[int, str, int, tuple[str | int, ...]]:
    family = 0 if r.os.startswith("debian") else 1
    return family, r.os, FRAMEWORK_ORDER.index(r.framework) if r.framework in FRAMEWORK_ORDER else 9, natural(r.name)


def natural(name: str) -> tuple[str | int, ...]:
    """``name`` as a sort key whose digit runs compare as numbers: pytorch2.7.1-... before
    pytorch2.15.0-... (as strings, "2.15" < "2.7": the catalogue once listed 2.7.1 last)."""
    return tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", name)))


def markdown(all_rows: Iterable[Row]) -> str:
    ordered = sorted(all_rows, key=_group)
    built = [r for r in ordered if r.built]
    lines = [
        "# Image catalogue",
        "",
        f"<!-- written by `{GENERATOR}` from matrix.yaml, images/*/manifest.json and {RECORD}: edit those, "
        "not this page -->",
        "",
        f"{len(ordered)} images the matrix builds; {len(built)} of them built and tested in a recorded run "
        f'(size and tiers below), the rest "not built yet" (the Ubuntu rows build FROM `nvidia/cuda` in CI, '
        "where a registry answers). Which one to pick for your cluster: [choose.md](choose.md). The same "
        "rows for tools: [images.json](images.json).",
        "",
        "Columns: **CUDA** is the toolkit the image carries (from NVIDIA's wheels on Debian, from the "
        "`nvidia/cuda` base on Ubuntu); **driver** is the drivers the NVIDIA container runtime starts it on: "
        "the first driver whose CUDA version is at least the image's (the `cuda>=` of its NVIDIA_REQUIRE_CUDA), "
        "and, for the Ubuntu rows, the older driver branches their base's forward-compatibility libraries "
        "(`/usr/local/cuda/compat`) support on data-center GPUs -- the base's own `brand=...,driver>=N,driver<N+1` "
        "alternatives; the runtime refuses every other driver (the Debian rows carry no compat libraries). "
        "Where the image starts, `tb-doctor --only gpu.forward_compat` says which of the two it takes and why "
        "([doctor.md](doctor.md)); **built for** is the GPUs (compute capabilities: 8.0 A100, 8.6 A10/A40, "
        "8.9 L4/L40S, 9.0 H100/H200, 10.0 B200/GB200, 10.3 B300, 12.0 RTX PRO 6000) of the CUDA row that the "
        "image's GPU code runs on: what trainbase compiles (Horovod's and DeepSpeed's CUDA ops, nccl-tests) "
        "targets the row's list, and each framework's own wheel carries the code it reports "
        "(`torch._C._cuda_getArchFlags()`, TensorFlow's build info; `gpu_code` in matrix.yaml, checked "
        'in the image by the static tier). A GPU listed with "PTX: ..." has no machine code in that '
        "wheel: its kernels are JIT-compiled from PTX when a process first uses them. A GPU after "
        '"not" is one the row declares and the image is not offered for, with the note below that says '
        "why. **Tested on** is where a recorded run's GPU tier passed: the GPUs it ran on, where and "
        'when; "no GPU tier recorded" means the image has been checked on no GPU yet, however many '
        "it is built for. **Tiers** are those a recorded run passed, "
        'with their passed checks counted. A size that says "(as rOLD; the recipe is rNEW since)" was measured on '
        "an image built from an earlier recipe (its Dockerfile, locks or in-image tools have changed since): "
        "the figures are that build's, and the current recipe has not been built in a recorded run.",
    ]
    current = None
    header = (
        "| image | platform | Python | CUDA | cuDNN | NCCL | NCCL net plugin | MPI / UCX | IB userspace | frameworks "
        "| built for | tested on | driver | size | tiers (where built) |"
    )
    notes: dict[str, int] = {}
    for r in ordered:
        # one heading per OS and framework: the Ubuntu base differs per CUDA version, so naming it
        # here would split a group into one heading per row
        base = r.base if r.os.startswith("debian") else f"nvidia/cuda:CUDA-base-{r.os}"
        heading = (
            f"{'Debian' if r.os.startswith('debian') else 'Ubuntu'} {r.os.removeprefix('debian').removeprefix('ubuntu')}"
            f" ({base}) — {r.framework if r.framework != 'none' else 'base images (no framework)'}"
        )
        if heading != current:
            lines += ["", f"## {heading}", "", header, "|" + "---|" * 15]
            current = heading
        where = f" ({r.built['where']}, {r.built['date']})" if r.built else ""
        lines.append(
            f"| `{r.name}` | {r.platform} | {r.python} | {r.cuda} | {r.cudnn} | {r.nccl} | {r.net_plugin} | "
            f"{r.mpi} / {r.ucx} | {r.ib} | {_frameworks(r)} | {_built_for(r, notes)} | {_tested_on(r)} | "
            f"{r.promise.text()} | {_size(r)} | {_tiers(r)}{where} |"
        )
    if notes:
        lines += ["", "## GPUs an image is not built for", ""]
        lines += [f"{n}. {why}" for why, n in sorted(notes.items(), key=lambda kv: kv[1])]
    return "\n".join(lines) + "\n"


def twin(all_rows: Iterable[Row]) -> str:
    return json.dumps({"schema": 1, "images": [asdict(r) for r in sorted(all_rows, key=_group)]}, indent=1) + "\n"


def current_tags(m: Matrix, root: Path) -> dict[str, str]:
    from .recipes import render_all  # about a second for the whole matrix; only the page needs it

    return {name: r.tag for name, r in render_all(m, root=root).items()}


def expected(m: Matrix, root: Path) -> dict[Path, str]:
    found = rows(m, root, load_record(root), current_tags(m, root))
    return {PAGE: markdown(found), TWIN: twin(found)}


def drift(m: Matrix, root: Path) -> list[str]:
    """The generated files that differ from what the sources say now."""
    return [
        str(p) for p, text in expected(m, root).items() if not (root / p).is_file() or (root / p).read_text() != text
    ]


def write(m: Matrix, root: Path) -> list[str]:
    """Rewrite the page and its twin from the sources; the paths that changed. `build.py render` calls
    it too: a recipe change re-tags cells, which the page's record columns say."""
    changed: list[str] = []
    if not (root / PAGE).parent.is_dir():
        return changed  # a matrix kept without the docs (a user's own folder, a test's copy): no page to keep
    for path, text in expected(m, root).items():
        if not (root / path).is_file() or (root / path).read_text() != text:
            safe_io.atomic_write(root / path, text)
            changed.append(str(path))
    return changed


def this_machine() -> str:
    """How a record names the machine a run was on: cores, architecture, OS (e.g. "2-core
    x86_64 Debian GNU/Linux 12 (bookworm)"), read from the host, not guessed."""
    import os
    import platform

    try:
        release = platform.freedesktop_os_release().get("PRETTY_NAME", "")
    except OSError:
        release = platform.system()
    return f"{os.cpu_count() or 1}-core {platform.machine()} {release}".strip()


def record_command(report: str, junitxml: str | None, profile: str | None) -> str:
    """The one command that records a build run (and the conformance run of its images) in the
    catalogue: what `build.py build --report` prints last, so a user's own run can bring the
    page's records to the recipes they built."""
    import os
    import shlex
    import sys

    where = f"{profile or 'selected'} profile, build.py build, {this_machine()}"
    python = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd() + os.sep) else "python"
    args = [python, "build.py", "catalogue", "--report", report]
    if junitxml:
        args += ["--junitxml", junitxml]
    return " ".join(shlex.quote(a) for a in [*args, "--where", where])


def command(m: Matrix, root: Path, report: str | None, junitxml: str | None, where: str | None) -> int:
    if report:
        if not where:
            print("build.py catalogue --report: say where the run was (--where 'ci profile, .ci/run, 2-core x86_64')")
            return 2
        record = load_record(root)
        tiers = tiers_from_junit(Path(junitxml)) if junitxml else {}
        gpus = gpus_from_junit(Path(junitxml)) if junitxml else ""
        try:  # a report another run wrote: cut short, not JSON or another file stops here, one line
            build_report = states.build_report(report)
        except safe_io.InputError as e:
            raise TrainbaseError(str(e)) from None
        done = record_run(record, build_report, tiers, where, date.today().isoformat(), gpus)
        safe_io.atomic_write(root / RECORD, json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"{RECORD}: {len(done)} cell(s) recorded from {report}" + (f" and {junitxml}" if junitxml else ""))
    for path, text in expected(m, root).items():
        (root / path).write_text(text)
        print(f"wrote {path}")
    return 0
