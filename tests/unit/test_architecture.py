"""The code's shape, checked: no import circle; the conformance package and the shared package
import nothing from the build package; no module over 400 lines; docker is reached only
through the engine adapter (trainbase_common/engine.py; buildkit.py for BuildKit builds)."""
import ast
import re
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

from .conftest import ROOT

PACKAGES = ("trainbase", "trainbase_common", "conformance")
ADAPTER = ("trainbase_common/engine.py", "trainbase_common/buildkit.py")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).glob("*.py")):
            name = pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"
            out[name] = f
    return out


def imports(name: str, path: Path) -> set[str]:
    """The package-internal modules ``name`` imports (absolute and relative)."""
    pkg = name if path.stem == "__init__" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = pkg + (f".{base}" if base else "")
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    known = modules()
    return {m for m in found if m in known and m != name}


def test_no_import_circle():
    graph = {name: imports(name, path) for name, path in modules().items()}
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        pytest.fail(f"import circle: {' -> '.join(e.args[1])}")


@pytest.mark.parametrize("pkg", ["conformance", "trainbase_common"])
def test_package_imports_nothing_from_the_build_package(pkg):
    bad = {name: sorted(m for m in imports(name, path) if m == "trainbase" or m.startswith("trainbase."))
           for name, path in modules().items() if name.split(".")[0] == pkg}
    assert not {k: v for k, v in bad.items() if v}, bad
    text = "\n".join(p.read_text() for n, p in modules().items() if n.split(".")[0] == pkg)
    assert not re.search(r"^\s*(from|import) trainbase(\.| |$)", text, re.M)


def test_no_module_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in modules().values() if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split these by responsibility: {long}"


def test_docker_is_reached_only_through_the_adapter():
    """No module but the adapter imports the docker SDK, runs a docker client, or reads its
    `--format '{{...}}'` output."""
    offenders = []
    for name, path in modules().items():
        if str(path.relative_to(ROOT)) in ADAPTER:
            continue
        text = path.read_text()
        if re.search(r"^\s*(import docker|from docker)\b", text, re.M) or re.search(r"\{\{\s*(json )?\.\w", text) \
                or re.search(r"\[\s*\"docker\"|docker_cli\(|build_cli\(\)\s*,", text):
            offenders.append(name)
    assert not offenders, f"docker reached outside {ADAPTER}: {offenders}"


IN_IMAGE = ROOT / "imagefs" / "opt" / "trainbase" / "lib"
# What the in-image tools may import lazily, inside a function, for the modes that need it:
# the image's own mpi4py (doctor --cluster) and torch (doctor --allreduce with torch).
IN_IMAGE_OPTIONAL = {"mpi4py", "torch"}


def test_in_image_tools_use_the_standard_library_only():
    """tb-launch and tb-doctor run under whatever Python an image has, before any pip install
    a user makes: module-level imports are the standard library or the tools themselves; the
    optional ones only inside functions. Each module stays under 400 lines, like the rest."""
    own = {p.stem for p in IN_IMAGE.glob("*.py")} | {p.name for p in IN_IMAGE.iterdir() if p.is_dir()}
    files = sorted(IN_IMAGE.rglob("*.py"))
    assert any(f.parent.name == "trainbase_doctor" for f in files), "the doctor package is gone"
    bad, long = [], {}
    for f in files:
        tree = ast.parse(f.read_text())
        if (n := len(f.read_text().splitlines())) > 400:
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
    assert not long, f"split these by responsibility: {long}"
