"""Read what a built image has (an Inventory) from the image itself, in one throwaway
container: /etc/os-release, dpkg's database, the Python distributions of the image's own
Python, its manifest. Components trainbase builds from pinned downloads (Open MPI, UCX,
Miniforge, an sdist) come from the cell's artifacts, with their URL and sha256; the base is
handed in as the build recorded it (build/bases.py: a registry digest, or the local bootstrap's
package-list digest)."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainbase_common import engine

from ..errors import TrainbaseError
from .inventory import Inventory, Package

# One shell script, sections marked with @@NAME lines; $TB_PYTHON is the manifest's Python.
READ_SCRIPT = r"""
echo @@os; cat /etc/os-release
echo @@deb; dpkg-query -W -f='${Package}\t${Version}\t${Architecture}\t${source:Package}\n' 2>/dev/null
echo @@pypi; "$TB_PYTHON" -c 'import importlib.metadata as m, json
print(json.dumps(sorted({(d.metadata["Name"], d.version) for d in m.distributions() if d.metadata["Name"]})))'
echo @@manifest; cat /etc/trainbase/manifest.json
"""


def _sections(text: str) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@@"):
            current = line[2:].strip()
            out[current] = []
        elif current:
            out[current].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def parse(text: str, cell: str, tag: str, image_id: str, base: dict[str, str], components: list[Package]) -> Inventory:
    """The READ_SCRIPT's output -> Inventory (pure; unit-tested)."""
    s = _sections(text)
    missing = [k for k in ("os", "deb", "pypi", "manifest") if k not in s]
    if missing:
        raise TrainbaseError(f"reading {cell}:{tag}: no {', '.join(missing)} section in the image's answer")
    os_release = {}
    for line in s["os"].splitlines():
        k, _, v = line.partition("=")
        if k:
            os_release[k] = v.strip().strip('"')
    packages = []
    for line in s["deb"].splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[0] and parts[1]:
            packages.append(
                Package(
                    "deb", parts[0], parts[1], arch=parts[2], source=(parts[3] if len(parts) > 3 else "") or parts[0]
                )
            )
    for name, version in json.loads(s["pypi"] or "[]"):
        packages.append(Package("pypi", name, version))
    manifest = json.loads(s["manifest"]) if s["manifest"].strip() else {}
    keep: dict[str, str] = {
        k: os_release[k] for k in ("ID", "VERSION_ID", "VERSION_CODENAME", "PRETTY_NAME") if k in os_release
    }
    return Inventory(
        cell=cell,
        tag=tag,
        image_id=image_id,
        os=keep,
        base=base,
        packages=tuple(sorted(packages + components)),
        manifest=manifest,
    )


def components_of(
    artifacts: list[dict[str, Any]],
    tools_digest: str,
    sources: Sequence[dict[str, Any]] = (),
) -> list[Package]:
    """What trainbase itself put into the image from pinned downloads (name, version from the
    artifact key, URL, sha256), from pinned source trees (name, the tag's version, the GitHub
    repository at the commit: sources carry no file digest, their pin is commit + tree id) and
    its own tools (tb-launch, tb-doctor, ...)."""
    out = [Package("component", "trainbase-tools", tools_digest[:12], source="imagefs/")]
    for src in sources:
        name = src["repository"].rsplit("/", 1)[-1]
        out.append(
            Package(
                "component",
                name,
                src["tag"].removeprefix("v"),
                source=f"git+https://github.com/{src['repository']}@{src['commit']}",
            )
        )
    for a in artifacts:
        # matrix.yaml's keys read NAME-VERSION[-what]: openmpi-4.1.4-debian, miniforge-25.3.0-3
        m = re.match(r"(.+?)-(\d[\w.]*(?:-\d+)?)(?:-[a-z]+)?$", a["key"])
        name, version = (m.group(1), m.group(2)) if m else (a["key"], "")
        pin = a.get("sha256") or ""
        if not version:  # a signing key: its identity is its fingerprint
            version = (a.get("openpgp_fingerprint") or pin or "unpinned")[-16:]
        out.append(Package("component", name, version, source=a["url"], sha256=pin if len(pin) == 64 else ""))
    return out


def read(image: str, cell: str, tag: str, base: dict[str, str], components: list[Package]) -> Inventory:
    info = engine.inspect_image(image)
    if info is None:
        raise TrainbaseError(f"{image} is not in the engine")
    manifest_py = None
    name = f"tb-inventory-{uuid.uuid4().hex[:8]}"
    cid = engine.run_detached(
        image,
        ["sleep", "infinity"],
        name=name,
        labels={"io.trainbase.inventory": "1"},
        opts=engine.RunOptions(init=False),
    )
    try:
        m = engine.exec_in(cid, ["cat", "/etc/trainbase/manifest.json"])
        if m.returncode == 0:
            manifest_py = json.loads(m.stdout)["components"]["python"]["prefix"] + "/bin/python"
        r = engine.exec_in(
            cid,
            ["/bin/sh", "-c", f"TB_PYTHON={shlex.quote(manifest_py or 'python3')}; export TB_PYTHON; {READ_SCRIPT}"],
        )
    finally:
        engine.remove_container(cid)
    if r.returncode != 0:
        raise TrainbaseError(f"reading the inventory of {image} failed: {r.stderr.strip()[-300:]}")
    return parse(r.stdout, cell, tag, info.id, base, components)


def tools_digest(root: Path) -> str:
    """The toolbox and in-image tools as shipped (bytecode excluded), for the component entry."""
    h = hashlib.sha256()
    for f in sorted((root / "imagefs").rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
            h.update(f"{f.relative_to(root)}\n".encode() + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()
