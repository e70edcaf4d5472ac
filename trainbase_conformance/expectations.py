"""What an image trainbase did NOT build claims, from a small file its user writes: the same
shape as the ``components`` of a trainbase manifest, every component optional. The checks read
it exactly as they read a manifest; a component the file does not declare makes the checks
that need it skip with that reason (a trainbase manifest missing one is a failure instead).

    # azureml-openmpi.yaml
    name: azureml-openmpi4.1.0-ubuntu22.04
    python: {prefix: /opt/miniconda}
    mpi: {kind: openmpi, version: 4.1.0, prefix: /opt/openmpi}
    ib: {kind: rdma-core, providers: [mlx5]}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from trainbase_common.manifest import MANIFEST_PATH

from .resources import EXPECTATIONS_SCHEMA


class ExpectationsError(ValueError):
    """The expectations file cannot be used; the message names the file and the field."""


class DeclaredComponents(dict[str, Any]):
    """``components`` of an expectations file: looking up a component it does not declare
    skips the check (pytest.skip) naming the component, instead of a KeyError."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        super().__init__(data)
        self.source = source

    def __missing__(self, key: str) -> Any:
        pytest.skip(f"{self.source} declares no '{key}' (image not built by trainbase): nothing to check against")


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
    components = {k: v for k, v in data.items() if k not in ("name", "frameworks")}
    return {
        "name": data.get("name", image),
        "foreign": True,
        "components": DeclaredComponents(components, source),
        "frameworks": dict(data.get("frameworks") or {}),
    }


def image_manifest(image: str, container: Any, expect: str | None) -> dict[str, Any]:
    """The image's own manifest (read from ``container``); for an image without one, the
    user's expectations file; neither is a failure that says what to do."""
    try:
        manifest: dict[str, Any] = json.loads(container.read(MANIFEST_PATH))
        return manifest
    except FileNotFoundError:
        if not expect:
            pytest.fail(
                f"{image} carries no {MANIFEST_PATH} (not built by trainbase?): say what it "
                f"holds in an expectations file and pass --expect FILE (docs/conformance.md)"
            )
    try:
        return as_manifest(load(expect), image, Path(expect).name)
    except ExpectationsError as e:
        pytest.fail(str(e), pytrace=False)
