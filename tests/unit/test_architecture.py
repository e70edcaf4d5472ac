"""The code's shape, checked: no import circle; the build package's stages import only earlier
stages; the conformance package and the shared package import nothing from the build package,
and nothing beyond the dependencies the suite's wheel declares (packaging/conformance);
the largest modules reported (a smell to read, no cap); the suite's plugin parts registered in
import order; docker is reached only through the engine adapter (the package
trainbase_common/engine/; buildkit.py for BuildKit builds); the in-image tools use the
standard library only and import no circle either."""

import ast
import re
import sys
import warnings
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

from .conftest import ROOT

PACKAGES = ("trainbase", "trainbase_common", "trainbase_conformance")
ADAPTER = ("trainbase_common/engine/", "trainbase_common/buildkit.py")  # a folder, or a file


def package_modules(root: Path, packages) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``, subpackages included: dotted name -> file
    (a package is named by its ``__init__.py``)."""
    out = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def modules() -> dict[str, Path]:
    return package_modules(ROOT, PACKAGES)


def imports(name: str, path: Path, known: dict[str, Path] | None = None) -> set[str]:
    """The modules of ``known`` (default: ``modules()``) that ``name`` imports, absolute and
    relative (``from ..define import matrix`` climbs one package per extra dot), at module
    level or inside a function alike."""
    known = modules() if known is None else known
    here = name.split(".") if path.stem == "__init__" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here[: len(here) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m in known and m != name}


def import_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    return {name: imports(name, path, known) for name, path in known.items()}


def assert_no_circle(known: dict[str, Path]) -> None:
    try:
        list(TopologicalSorter(import_graph(known)).static_order())
    except CycleError as e:
        pytest.fail(f"import circle: {' -> '.join(e.args[1])}")


def test_no_import_circle():
    assert_no_circle(modules())


# The build package's stages, lowest first. Why this order: it is the order the flow runs, and
# each stage consumes only what an earlier one hands on -- define reads matrix.yaml and the
# locks; render turns cells into Dockerfiles and recipe tags (folding the locks in); build plans
# and builds the rendered cells; supply documents and gates what was built; deliver publishes
# what passed and plans CI over rendered tags. `run` (the executor) is no step of the flow but
# drives one plan through build, supply and deliver, so it comes after all three; the command
# line is on top, and errors is the leaf every stage raises. An import against this order
# means the flow runs backwards somewhere (the renderer depending on how an image is built,
# the build on what publishing does): move the code to the stage whose data it needs.
STAGES = ["errors", "define", "render", "build", "supply", "deliver", "run", "cli"]


def stage_of(name: str) -> str:
    """trainbase.render.recipes -> render; trainbase.cli -> cli; trainbase -> ''."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def build_package() -> dict[str, Path]:
    return {n: p for n, p in modules().items() if n.split(".")[0] == "trainbase"}


def test_every_module_of_the_build_package_has_a_stage():
    unplaced = sorted(n for n in build_package() if n != "trainbase" and stage_of(n) not in STAGES)
    assert not unplaced, f"put these in a stage subpackage (or add the stage to STAGES, in order): {unplaced}"
    folders = sorted(d.name for d in (ROOT / "trainbase").iterdir() if d.is_dir() and (d / "__init__.py").exists())
    assert set(folders) <= set(STAGES), f"a subpackage that is no stage: {sorted(set(folders) - set(STAGES))}"


def test_stages_import_only_earlier_stages():
    """define < render < build < supply < deliver < run < cli (errors below all of them): a
    module imports its own stage or an earlier one, never a later one -- lazily inside a
    function included (a late import hides a backwards dependency, it does not remove it)."""
    known = modules()
    backwards = []
    for name, path in build_package().items():
        if stage_of(name) not in STAGES:  # the package root; an unplaced module fails above
            continue
        mine = STAGES.index(stage_of(name))
        for m in sorted(imports(name, path, known)):
            if m.startswith("trainbase.") and stage_of(m) in STAGES and STAGES.index(stage_of(m)) > mine:
                backwards.append(f"{name} ({stage_of(name)}) imports {m} ({stage_of(m)})")
    assert not backwards, backwards


@pytest.mark.parametrize("stage", [s for s in STAGES if (ROOT / "trainbase" / s).is_dir()])
def test_each_stage_says_what_it_takes_and_hands_on(stage):
    """A stage's __init__.py is its docstring only: what the stage takes and what it hands on
    (re-exports would make `from trainbase.build import x` pull the whole stage, and hide
    which module a name comes from)."""
    tree = ast.parse((ROOT / "trainbase" / stage / "__init__.py").read_text())
    doc = ast.get_docstring(tree) or ""
    assert "Takes" in doc and "Hands on" in doc, f"trainbase/{stage}/__init__.py must say what it takes and hands on"
    assert len(tree.body) == 1, f"trainbase/{stage}/__init__.py holds more than its docstring"
    assert not imports("trainbase", ROOT / "trainbase" / "__init__.py"), "trainbase/__init__.py imports something"


@pytest.mark.parametrize("pkg", ["trainbase_conformance", "trainbase_common"])
def test_package_imports_nothing_from_the_build_package(pkg):
    bad = {
        name: sorted(m for m in imports(name, path) if m == "trainbase" or m.startswith("trainbase."))
        for name, path in modules().items()
        if name.split(".")[0] == pkg
    }
    assert not {k: v for k, v in bad.items() if v}, bad
    text = "\n".join(p.read_text() for n, p in modules().items() if n.split(".")[0] == pkg)
    assert not re.search(r"^\s*(from|import) trainbase(\.| |$)", text, re.M)


# What the conformance wheel declares (packaging/conformance/pyproject.toml), by import name.
WHEEL_DEPENDENCIES = {"pytest", "testinfra", "docker", "jsonschema", "yaml"}


def test_the_conformance_wheel_imports_only_what_it_ships_and_declares():
    """The installed suite has no checkout: its two packages may import the standard library,
    each other, and the wheel's declared dependencies, nothing else (the shared package not the
    suite either: the build imports it too)."""
    shipped = ("trainbase_conformance", "trainbase_common")
    bad = {}
    for name, path in modules().items():
        top = name.split(".")[0]
        if top not in shipped or name.startswith("trainbase_conformance.probes."):
            continue  # the probes run inside the images, with the image's mpi4py / torch
        allowed = set(shipped if top == "trainbase_conformance" else ("trainbase_common",))
        allowed |= WHEEL_DEPENDENCIES | set(sys.stdlib_module_names)
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
        if found - allowed - {"__future__"}:
            bad[name] = sorted(found - allowed - {"__future__"})
    assert not bad, f"imports the installed suite cannot satisfy: {bad}"


# A module's size is a smell to look at, not a wall to press against (a hard cap made three
# modules squeeze to exactly its figure): the largest ones are reported as a warning in pytest's
# summary, and a module is cut where its concerns part, not at a line count.
LARGE_MODULE_LINES = 500


def test_largest_modules_are_reported() -> None:
    sizes = sorted(
        ((len(p.read_text().splitlines()), str(p.relative_to(ROOT))) for p in modules().values()), reverse=True
    )
    assert sizes, "no modules found: the architecture tests read nothing"
    large = [f"{name} ({n} lines)" for n, name in sizes if n > LARGE_MODULE_LINES]
    if large:
        warnings.warn(
            f"modules over {LARGE_MODULE_LINES} lines, read whether each is still one concern: " + ", ".join(large),
            stacklevel=1,
        )


def test_the_suite_plugins_parts_are_registered_before_they_are_imported():
    """trainbase_conformance/plugin.py registers its parts with ``pytest_plugins``, in order:
    pytest rewrites the asserts of a plugin module it imports itself, and warns in every run
    about one already imported (by an earlier part). So no part imports, even through another
    module of the suite, a part listed after it; and the entry point imports none of them (their
    hooks would be registered twice)."""
    from trainbase_conformance import plugin

    known = modules()
    graph = import_graph(known)

    def reaches(name: str) -> set[str]:
        seen: set[str] = set()
        todo = [name]
        while todo:
            for m in graph.get(todo.pop(), set()) - seen:
                seen.add(m)
                todo.append(m)
        return seen

    parts = list(plugin.pytest_plugins)
    assert parts and all(p in known for p in parts), parts
    early = [
        f"{part} imports {later}, listed after it"
        for i, part in enumerate(parts)
        for later in parts[i + 1 :]
        if later in reaches(part)
    ]
    assert not early, early
    assert not set(parts) & reaches("trainbase_conformance.plugin")


def test_docker_is_reached_only_through_the_adapter():
    """No module but the adapter imports the docker SDK, runs a docker client, or reads its
    `--format '{{...}}'` output."""
    offenders = []
    for name, path in modules().items():
        if str(path.relative_to(ROOT)).startswith(ADAPTER):
            continue
        text = path.read_text()
        if (
            re.search(r"^\s*(import docker|from docker)\b", text, re.M)
            or re.search(r"\{\{\s*(json )?\.\w", text)
            or re.search(r"\[\s*\"docker\"|docker_cli\(|build_cli\(\)\s*,", text)
        ):
            offenders.append(name)
    assert not offenders, f"docker reached outside {ADAPTER}: {offenders}"


IN_IMAGE = ROOT / "imagefs" / "opt" / "trainbase" / "lib"
DOCTOR = IN_IMAGE / "trainbase_doctor"
# What the in-image tools may import lazily, inside a function, for the modes that need it:
# the image's own mpi4py (doctor --cluster) and torch (doctor --allreduce with torch).
IN_IMAGE_OPTIONAL = {"mpi4py", "torch"}


def test_in_image_tools_use_the_standard_library_only():
    """tb-launch and tb-doctor run under whatever Python an image has, before any pip install
    a user makes: module-level imports are the standard library or the tools themselves; the
    optional ones only inside functions. Their size is reported with the rest's (a warning over
    LARGE_MODULE_LINES), not capped."""
    own = {p.stem for p in IN_IMAGE.glob("*.py")} | {p.name for p in IN_IMAGE.iterdir() if p.is_dir()}
    files = sorted(IN_IMAGE.rglob("*.py"))
    assert any(f.parent.name == "trainbase_doctor" for f in files), "the doctor package is gone"
    bad, long = [], {}
    for f in files:
        tree = ast.parse(f.read_text())
        if (n := len(f.read_text().splitlines())) > LARGE_MODULE_LINES:
            long[str(f.relative_to(ROOT))] = n
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                root = name.split(".")[0]
                if root in sys.stdlib_module_names or root in own:
                    continue
                if root in IN_IMAGE_OPTIONAL and id(node) not in top:
                    continue
                bad.append(f"{f.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not bad, bad
    if long:
        warnings.warn(
            f"in-image modules over {LARGE_MODULE_LINES} lines, read whether each is one concern: {long}", stacklevel=1
        )


def test_no_import_circle_in_the_in_image_tools():
    """The same rule inside the image: the doctor's check modules (node, fabric, stack) share
    what they ask the hardware through one lower module (``hardware``), never through each
    other; the loose tools (tb-launch's module, the Slurm and exit helpers) are in the graph too."""
    known = package_modules(IN_IMAGE, [DOCTOR.name]) | {p.stem: p for p in sorted(IN_IMAGE.glob("*.py"))}
    assert {"trainbase_doctor.checks_node", "trainbase_doctor.checks_fabric", "trainbase_doctor.hardware"} <= set(known)
    assert_no_circle(known)
    graph = import_graph(known)
    checks = {n for n in known if n.startswith("trainbase_doctor.checks_")}
    assert not {n: graph[n] & checks for n in checks if graph[n] & checks}, "a check module imports another"
