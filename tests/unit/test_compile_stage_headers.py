"""Each Open MPI compile stage installs the headers its configure line asks for (issue 71):
`--with-ucx=/usr` needs UCX's headers from a package, `--with-verbs` rdma-core's -dev. The DOCA
rows' toolchain stage had DOCA's userspace libraries only (doca-ofed-userspace and tools): their
configure would find no ucp/api/ucp.h, hidden until now behind the DOCA key's failure. Read from
every rendered recipe, following each stage's FROM chain."""

from __future__ import annotations

import re

from trainbase.define.matrix import load

from .conftest import ROOT
from .test_distro_packages import packages_named

_STAGE = re.compile(r"^FROM (\S+)(?: AS (\S+))?$", re.M)


def stages(text: str) -> dict[str, tuple[str, str]]:
    """stage name -> (what it is FROM, its text)."""
    found = list(_STAGE.finditer(text))
    out = {}
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        out[m.group(2) or f"#{i}"] = (m.group(1), text[m.end() : end])
    return out


def installed_in_chain(all_stages: dict[str, tuple[str, str]], name: str) -> set[str]:
    names: set[str] = set()
    while name in all_stages:
        parent, body = all_stages[name]
        names |= packages_named(body)
        name = parent
    return names


def missing_headers(text: str, spec, os_key: str) -> list[str]:
    all_stages = stages(text)
    if "openmpi-build" not in all_stages:
        return []
    body = all_stages["openmpi-build"][1]
    have = installed_in_chain(all_stages, "openmpi-build")
    missing = []
    if "--with-ucx=/usr " in body:
        ucx_headers = {spec.package_name("ucx-dev", os_key), spec.package_name("doca-ucx", os_key)}
        if not have & ucx_headers:
            missing.append(f"--with-ucx=/usr without UCX's headers (one of {sorted(ucx_headers)})")
    if "--with-verbs" in body and spec.package_name("verbs-dev", os_key) not in have:
        missing.append(f"--with-verbs without {spec.package_name('verbs-dev', os_key)}")
    return missing


def _recipe(name: str) -> str:
    return (ROOT / "images" / name / "Dockerfile").read_text()


def test_every_open_mpi_compile_stage_has_its_headers():
    m = load(ROOT / "matrix.yaml")
    bad = []
    checked = 0
    for cell in m.included:
        if cell.parent is None and m.spec.mpi[cell.mpi].install == "source":
            checked += 1
            bad += [f"{cell.name}: {w}" for w in missing_headers(_recipe(cell.name), m.spec, cell.os)]
    assert checked > 10 and not bad, "\n".join(bad)


def test_the_doca_toolchain_before_issue_71_is_refused():
    m = load(ROOT / "matrix.yaml")
    name = "openmpi4.1.8-doca3.2-cuda12.8-cudnn9-ubuntu24.04"
    text = _recipe(name)
    # the recipe of 591e86f: the RUN installing DOCA's UCX and the -dev packages was not there
    old = re.sub(r"# The ib block gave this stage.*?\n(?=RUN --mount=type=secret)", "", text, flags=re.S)
    assert old != text
    assert len(missing_headers(old, m.spec, "ubuntu24.04")) == 2
    assert missing_headers(text, m.spec, "ubuntu24.04") == []
