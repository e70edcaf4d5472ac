"""Bandwidth floors come from the runner, not from the image: a small file the runner's owner
writes (runner.schema.json) and names in the runner's environment (``TRAINBASE_RUNNER_EXPECT=FILE``)
says its fabric and, per scope, the least bus bandwidth (nccl-tests' busbw) a collective must
reach at a message size. The collectives
probe (probes/collectives.py) measures; the pure functions here judge its document, so every
verdict is unit-testable without a GPU.

    # runner.yaml: an 8-GPU NVSwitch node with InfiniBand NDR between nodes
    name: dgx-h100
    fabric: {intra_node: nvswitch, inter_node: infiniband-ndr}
    floors:
      intra_node:                       # the gpu tier: one rank per local GPU
        - {collective: all_reduce, bytes: 268435456, busbw_GBps: 360}
      inter_node:                       # the multinode tier: across containers
        - {collective: all_reduce, bytes: 4194304, busbw_GBps: 0.5}

A scope without floors passes nothing on bandwidth: its check prints the figures and skips,
saying so (a skip, so the report counts it).
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import yaml

from .expectations import ExpectationsError
from .resources import PROBES, RUNNER_SCHEMA

# An environment variable, not a pytest option: the runner's owner sets it once in the runner's
# service environment, and every suite run on that machine (any image, any command) is judged alike.
RUNNER_ENV = "TRAINBASE_RUNNER_EXPECT"
SCOPES = {"intra_node": "every local GPU (gpu tier)", "inter_node": "across containers (multinode tier)"}


@dataclass(frozen=True)
class Floor:
    collective: str
    bytes: int
    busbw_GBps: float


@dataclass(frozen=True)
class RunnerExpectations:
    """The runner's declared fabric per scope and its floors per scope."""

    source: str
    name: str = ""
    fabric: dict[str, str] = field(default_factory=dict)
    floors: dict[str, list[Floor]] = field(default_factory=dict)


def load_runner(path: str | Path) -> RunnerExpectations:
    """The validated runner file (YAML or JSON); ExpectationsError names the file and every problem."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ExpectationsError(f"{p}: cannot read the runner's expectations: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ExpectationsError(f"{p}: not YAML/JSON: {e}") from e
    return runner_from(data, p.name)


def declared_runner() -> RunnerExpectations | None:
    """The file $TRAINBASE_RUNNER_EXPECT names, or None where it is unset."""
    path = os.environ.get(RUNNER_ENV, "")
    return load_runner(path) if path else None


def runner_from(data: Any, source: str) -> RunnerExpectations:
    schema = json.loads(RUNNER_SCHEMA.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data), key=lambda e: list(e.path))
    if errors:
        lines = [f"  {'.'.join(str(x) for x in e.path) or '(top level)'}: {e.message}" for e in errors]
        raise ExpectationsError(
            f"{source}: does not follow the runner schema ({RUNNER_SCHEMA.name}):\n" + "\n".join(lines)
        )
    floors = {
        scope: [Floor(f["collective"], int(f["bytes"]), float(f["busbw_GBps"])) for f in items]
        for scope, items in (data.get("floors") or {}).items()
    }
    return RunnerExpectations(source=source, name=str(data.get("name", "")), fabric=dict(data["fabric"]), floors=floors)


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def no_floor_reason(runner: RunnerExpectations | None, scope: str) -> str:
    """Why bandwidth is not judged for ``scope``: the skip reason, said in the summary."""
    if runner is None:
        return (
            f"no bandwidth floor: the runner declares none ({RUNNER_ENV}=FILE, runner.schema.json) "
            f"for {SCOPES[scope]}; figures printed, nothing passed on bandwidth"
        )
    return (
        f"no bandwidth floor: {runner.source} declares no floors.{scope} ({SCOPES[scope]}); "
        f"figures printed, nothing passed on bandwidth"
    )


def row_for(document: dict[str, Any], floor: Floor) -> dict[str, Any] | None:
    """The measured row a floor is judged on: the largest size at most the floor's, and at least
    half of it (a size the probe never reached is not judged by a smaller one)."""
    rows = document.get("collectives", {}).get(floor.collective, {}).get("rows") or []
    near = [r for r in rows if floor.bytes // 2 < r["bytes"] <= floor.bytes]
    return max(near, key=lambda r: int(r["bytes"])) if near else None


def floor_misses(document: dict[str, Any], floors: list[Floor], fabric: str = "") -> list[str]:
    """Every floor the measured document does not meet, each naming the collective, the size,
    the measured busbw and the floor; a floor with no measurement, or on wrong values, is a miss."""
    on = f" ({fabric})" if fabric else ""
    misses = []
    for f in floors:
        what = f"{f.collective} at {human_bytes(f.bytes)}"
        c = document.get("collectives", {}).get(f.collective, {})
        row = row_for(document, f)
        if row is None:
            why = next((f"{k}: {v}" for k, v in c.items() if k in ("unsupported", "skipped", "missing")), "")
            sizes = [human_bytes(int(r["bytes"])) for r in c.get("rows") or []]
            misses.append(
                f"{what}: not measured ({why or 'sizes measured: ' + ', '.join(sizes or ['none'])}), "
                f"the runner's floor is {f.busbw_GBps:g} GB/s{on}"
            )
        elif not row["ok"]:
            misses.append(f"{what}: values wrong, no bandwidth to judge against the floor {f.busbw_GBps:g} GB/s{on}")
        elif row["busbw_GBps"] < f.busbw_GBps:
            at = "" if row["bytes"] == f.bytes else f" (measured at {human_bytes(int(row['bytes']))})"
            misses.append(
                f"{what}: busbw {row['busbw_GBps']:g} GB/s is below the runner's floor {f.busbw_GBps:g} GB/s{on}{at}"
            )
    return misses


def value_problems(document: dict[str, Any], world: int, every_collective: bool) -> list[str]:
    """What is wrong with the probe's values: a rank missing or failed, a world of the wrong size,
    a wrong element (collective, size, rank, index, got, want), and, where ``every_collective``
    (NCCL has them all), a collective the backend lacks. Otherwise lacking ones are reported, not failed."""
    problems = [str(e) for e in document.get("errors") or []]
    if document.get("world") != world:
        problems.append(f"the probe ran {document.get('world')} rank(s), want {world}")
    for coll, c in (document.get("collectives") or {}).items():
        if "missing" in c:
            problems.append(f"{coll}: {c['missing']}")
        if "unsupported" in c and every_collective:
            problems.append(f"{coll}: {c['unsupported']}")
        for r in c.get("rows") or []:
            if not r["ok"]:
                m = r["first_mismatch"]
                where = "".join(f", {k} {m[k]}" for k in ("root", "pair") if k in m)
                problems.append(
                    f"{coll} at {human_bytes(int(r['bytes']))}: rank {m.get('rank')} element "
                    f"{m['index']} is {m['got']}, want {m['want']} ({m['wrong']} wrong{where})"
                )
    return problems


def load_probe() -> ModuleType:
    """probes/collectives.py as a module (its merge() and table()), from the package's probe folder:
    the probes are scripts copied into images, not modules of this package."""
    spec = importlib.util.spec_from_file_location("tbconf_collectives", PROBES / "collectives.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
