"""What an image trainbase did NOT build claims, from a small file its user writes: the same
shape as the ``components`` of a trainbase manifest, every component but ``python`` optional.
The checks read it exactly as they read a manifest. A component the file does not declare is
looked for in the image (COMPONENTS: its files by name): a check that needs it skips, saying
what to declare, only where the image holds none; where the image holds one the file does not
declare, the check fails, saying what was found and what to declare (a trainbase manifest
missing one is a failure too). Every field of the file is read by a check (READERS): the schema
refuses any other, so a typo cannot turn a check off. On an image that carries its own manifest
the file is not ignored: each of its claims the manifest does not make is a disagreement
(disagreements), which fails the image's verdict (checks/test_verdict.py).

    # azureml-openmpi.yaml
    name: azureml-openmpi4.1.0-ubuntu22.04
    python: {prefix: /opt/miniconda}
    mpi: {kind: openmpi, version: 4.1.0, prefix: /opt/openmpi}
    ib: {providers: [mlx5]}
    duplicate_libraries:                  # sonames the image may carry as 2+ files, each with why
      - {soname: libz.so.1, reason: Miniconda's zlib beside the distro's,
         places: [/opt/miniconda/lib/*, /usr/lib/*-linux-gnu/*]}   # optional: where the copies may lie
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import jsonschema
import pytest
import yaml

from trainbase_common.manifest import MANIFEST_PATH

from .resources import EXPECTATIONS_SCHEMA


class ExpectationsError(ValueError):
    """The expectations file cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Component:
    """What an expectations file may declare beside ``python``: how the image shows it holds one
    (file names, shell patterns, any of which found anywhere in its filesystem) and how to
    declare it."""

    what: str
    names: tuple[str, ...]
    example: str


COMPONENTS = {
    "mpi": Component("an MPI launcher", ("mpirun", "mpiexec"), 'mpi: {kind: openmpi, version: "4.1.4"}'),
    "nccl": Component("NCCL", ("libnccl.so*",), 'nccl: {version: "2.21.5"}'),
    "cuda": Component("the CUDA runtime", ("libcudart.so*",), 'cuda: {version: "12.8"}'),
    "cudnn": Component("cuDNN", ("libcudnn.so*",), 'cudnn: {version: "9.10.2.21"}'),
    "ucx": Component("UCX", ("libucp.so*",), 'ucx: {version: "1.16.0"}'),
    "ib": Component("the InfiniBand userspace (libibverbs)", ("libibverbs.so*",), "ib: {providers: [mlx5]}"),
    "gdrcopy": Component("GDRCopy's userspace library", ("libgdrapi.so*",), 'gdrcopy: {version: "2.6"}'),
    "libfabric": Component("libfabric", ("libfabric.so*",), 'libfabric: {version: "2.6.0", providers: [efa]}'),
    "nccl_net_plugin": Component(
        "an NCCL network plugin",
        ("libnccl-net*.so",),
        "nccl_net_plugin: {name: aws-ofi-nccl, version: 1.21.1, files: [/opt/amazon/ofi-nccl/lib/libnccl-net.so]}",
    ),
    "nccl_tests": Component(
        "nccl-tests' benchmarks",
        ("all_reduce_perf",),
        "nccl_tests: {version: 2.19.6, binaries: [/opt/nccl-tests/build/all_reduce_perf]}",
    ),
}
# frameworks.NAME: the Python package the framework installs (found as a package directory)
FRAMEWORKS = {"pytorch": "torch", "tensorflow": "tensorflow", "horovod": "horovod", "deepspeed": "deepspeed"}
# Every field an expectations file may hold, and the check that reads it: the schema allows
# these and no other (tests/unit/test_expectations.py holds the two to each other), so a field
# that no check reads, or a misspelt one, is refused before any container starts.
READERS = {
    "name": "test_supply_chain.py::test_image_carries_its_cyclonedx_sbom",
    "python.prefix": "test_integrity.py::test_the_declared_python_runs",
    "python.version": "test_integrity.py::test_the_declared_python_runs",
    "python.mpi4py": "test_integrity.py::test_the_declared_python_runs",
    "mpi.kind": "test_mpi.py::test_launchers_on_path_are_the_manifests_mpi",
    "mpi.version": "test_mpi.py::test_launchers_on_path_are_the_manifests_mpi",
    "mpi.prefix": "test_mpi.py::test_launchers_on_path_are_the_manifests_mpi",
    "cuda.version": "test_cuda.py::test_cuda_runtime_version",
    "cudnn.version": "test_cuda.py::test_cudnn_version",
    "nccl.version": "test_nccl.py::test_nccl_version_from_the_library",
    "ucx.version": "test_ib.py::test_ucx_version",
    "ib.providers": "test_ib.py::test_verbs_providers",
    "gdrcopy.version": "test_gdrcopy.py::test_libgdrapi_loads_and_is_the_declared_release",
    "libfabric.version": "test_libfabric.py::test_libfabric_is_the_declared_release_with_its_providers",
    "libfabric.providers": "test_libfabric.py::test_libfabric_is_the_declared_release_with_its_providers",
    "nccl_net_plugin.name": "test_nccl_net_plugin.py::test_plugin_loads_with_every_dependency_in_the_image",
    "nccl_net_plugin.version": "test_nccl_net_plugin.py::test_plugin_loads_with_every_dependency_in_the_image",
    "nccl_net_plugin.files": "test_nccl_net_plugin.py::test_plugin_loads_with_every_dependency_in_the_image",
    "nccl_tests.version": "test_nccl_tests.py::test_nccl_tests_resolve_the_images_one_nccl_and_its_mpi",
    "nccl_tests.binaries": "test_nccl_tests.py::test_nccl_tests_resolve_the_images_one_nccl_and_its_mpi",
    "duplicate_libraries": "test_libraries.py::test_one_copy_of_each_library",
    "frameworks.pytorch": "test_frameworks.py::test_pytorch_build_matches_manifest",
    "frameworks.tensorflow": "test_frameworks.py::test_tensorflow_build_matches_manifest",
    "frameworks.horovod": "test_frameworks.py::test_horovod_check_build_shows_claimed_frameworks_and_controllers",
    "frameworks.deepspeed": "test_frameworks.py::test_deepspeed_report_lists_the_prebuilt_ops_as_installed",
}
# The words every skip for want of a declaration carries: how the summary and the verdict
# (checks/test_verdict.py) tell such a skip from one that does not apply ("n/a: ...").
_UNDECLARED = re.compile(r"declares no '([\w.]+)' and the image holds none")
FIND_PRUNE = "\\( -path /proc -o -path /sys -o -path /dev \\) -prune"


def example(key: str) -> str:
    """How to declare ``key`` (a component, or frameworks.NAME) in an expectations file."""
    if key.startswith("frameworks."):
        return f'frameworks: {{{key.split(".", 1)[1]}: "VERSION"}}'
    return COMPONENTS[key].example if key in COMPONENTS else f"{key}: {{...}}"


def find_command() -> str:
    """One `find` over the image's filesystem that prints every file by which it holds a
    component or a framework (COMPONENTS, FRAMEWORKS): what ``found`` sorts."""
    names = [f"-name '{n}'" for c in COMPONENTS.values() for n in c.names]
    names += [f"-path '*-packages/{m}/__init__.py'" for m in FRAMEWORKS.values()]
    return f"find / -xdev {FIND_PRUNE} -o \\( -type f -o -type l \\) \\( {' -o '.join(names)} \\) -print 2>/dev/null"


def found(find_output: str) -> dict[str, list[str]]:
    """``find_command``'s output sorted by what it shows: component (or frameworks.NAME) ->
    the files found, sorted; what the image holds none of is absent."""
    from fnmatch import fnmatchcase

    out: dict[str, list[str]] = {}
    for path in sorted(set(find_output.split())):
        base = path.rsplit("/", 1)[-1]
        for key, c in COMPONENTS.items():
            if any(fnmatchcase(base, n) for n in c.names):
                out.setdefault(key, []).append(path)
        for fw, module in FRAMEWORKS.items():
            if re.search(rf"-packages/{re.escape(module)}/__init__\.py$", path):
                out.setdefault(f"frameworks.{fw}", []).append(path)
    return out


def undeclared(source: str, key: str, holds: list[str]) -> NoReturn:
    """A check needs ``key``, which the expectations file ``source`` does not declare: where the
    image holds it (``holds``: the files that show it), the check fails, naming them and what to
    declare; where it holds none, the check is skipped, saying what would make it run."""
    what = COMPONENTS[key].what if key in COMPONENTS else key.replace("frameworks.", "")
    if holds:
        shown = ", ".join(holds[:3]) + (f" and {len(holds) - 3} more" if len(holds) > 3 else "")
        pytest.fail(
            f"the image holds {what} ({shown}) but {source} declares no '{key}': declare `{example(key)}` "
            "(what the image claims to hold) so that it is checked",
            pytrace=False,
        )
    pytest.skip(f"{source} declares no '{key}' and the image holds none: declare `{example(key)}` to check it")


def undeclared_component(skip_message: str) -> str | None:
    """The component (or frameworks.NAME) a check was skipped for want of, from its skip
    message; None for a skip of another kind."""
    m = _UNDECLARED.search(skip_message)
    return m.group(1) if m else None


class DeclaredComponents(dict[str, Any]):
    """``components`` of an expectations file: looking up a component it does not declare
    skips the check or fails it (``undeclared``: skipped where the image holds none, failed
    where it holds one), instead of a KeyError. ``finder`` says which files of the image show
    a component (the ``target`` fixture sets it once the container runs)."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        super().__init__(data)
        self.source = source
        self.finder: Callable[[str], list[str]] | None = None

    def __missing__(self, key: str) -> Any:
        undeclared(self.source, key, self.finder(key) if self.finder else [])


def load(path: str | Path) -> dict[str, Any]:
    """The validated file (YAML or JSON); ExpectationsError names the file and every problem."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ExpectationsError(f"{p}: cannot read the expectations file: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ExpectationsError(f"{p}: not YAML/JSON: {e}") from e
    schema = json.loads(EXPECTATIONS_SCHEMA.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data), key=lambda e: list(e.path))
    if errors:
        lines = [f"  {'.'.join(str(x) for x in e.path) or '(top level)'}: {e.message}" for e in errors]
        raise ExpectationsError(
            f"{p}: does not follow the expectations schema ({EXPECTATIONS_SCHEMA.name}):\n" + "\n".join(lines)
        )
    expected: dict[str, Any] = data
    return expected


def as_manifest(data: dict[str, Any], image: str, source: str) -> dict[str, Any]:
    """A manifest-shaped view the checks read like a trainbase image's own manifest."""
    components = {k: v for k, v in data.items() if k not in ("name", "frameworks", "duplicate_libraries")}
    return {
        "name": data.get("name", image),
        "foreign": True,
        "components": DeclaredComponents(components, source),
        "frameworks": dict(data.get("frameworks") or {}),
        "duplicate_libraries": list(data.get("duplicate_libraries") or []),
    }


def _claims_of(data: dict[str, Any]) -> dict[str, Any]:
    """The file's claims as paths of a manifest: name, frameworks and duplicate_libraries at its
    top level, the rest under components."""
    top = ("name", "frameworks", "duplicate_libraries")
    return {(k if k in top else f"components.{k}"): v for k, v in data.items()}


_ABSENT = object()


def _at(manifest: dict[str, Any], path: str) -> Any:
    node: Any = manifest
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _item(x: Any) -> Any:
    """What a list item of a claim claims: a duplicate library by its soname, else itself."""
    return x.get("soname") if isinstance(x, dict) else x


def disagreements(manifest: dict[str, Any], data: dict[str, Any], source: str) -> list[str]:
    """Each claim of the expectations file ``data`` (named ``source``) that the image's own
    ``manifest`` does not make: a value it gives otherwise or not at all. A list claims each of
    its items (a provider, a duplicate's soname); the manifest may list more."""
    out: list[str] = []

    def walk(path: str, claim: Any) -> None:
        have = _at(manifest, path)
        shown = path.removeprefix("components.")
        if isinstance(claim, dict) and isinstance(have, dict):
            for k, v in claim.items():
                walk(f"{path}.{k}", v)
        elif isinstance(claim, list) and isinstance(have, list):
            missing = [_item(x) for x in claim if _item(x) not in {_item(y) for y in have}]
            if missing:
                out.append(f"{shown}: {source} lists {missing}, the manifest does not ({[_item(y) for y in have]})")
        elif have is _ABSENT:
            out.append(f"{shown}: {source} says {claim!r}, the manifest says nothing")
        elif claim != have:
            out.append(f"{shown}: {source} says {claim!r}, the manifest {have!r}")

    for path, claim in _claims_of(data).items():
        walk(path, claim)
    return out


def image_claims(image: str, container: Any, expect: str | None) -> tuple[dict[str, Any], list[str]]:
    """What the image claims: its own manifest (read from ``container``), and where an
    expectations file is given too, each of the file's claims the manifest disagrees with
    (the image's verdict fails on them: the file is never silently dropped); for an image
    without a manifest, the user's expectations file. Neither is a failure that says what to do."""
    try:
        manifest: dict[str, Any] = json.loads(container.read(MANIFEST_PATH))
    except FileNotFoundError:
        if not expect:
            pytest.fail(
                f"{image} carries no {MANIFEST_PATH} (not built by trainbase?): say what it "
                f"holds in an expectations file and pass --expect FILE (docs/conformance.md)"
            )
    else:
        if not expect:
            return manifest, []
        try:
            return manifest, disagreements(manifest, load(expect), Path(expect).name)
        except ExpectationsError as e:
            pytest.fail(str(e), pytrace=False)
    try:
        return as_manifest(load(expect), image, Path(expect).name), []
    except ExpectationsError as e:
        pytest.fail(str(e), pytrace=False)
