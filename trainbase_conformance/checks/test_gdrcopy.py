"""GDRCopy: the image's libgdrapi loads through the dynamic linker and is the release the manifest
and the io.trainbase.gdrcopy label name (issue 70).

UCX's gdr_copy transport and NCCL map GPU memory into the CPU's address space through it, on nodes
that load NVIDIA's gdrdrv kernel module (tb-doctor's gpu.gdrdrv says whether a node does). The
module is the node's; what an image can get wrong is the library: missing, unresolvable, or
another release than it says. Those need no GPU and no module to show -- only gdr_open() talks to
the driver -- so this is a static check. Expectations come from the manifest's components.gdrcopy."""

import pytest

from trainbase_conformance.fixtures import PROBE_DIR

LABEL = "io.trainbase.gdrcopy"


def soname(version: str) -> str:
    """libgdrapi's soname carries its API major version: 2.6 -> libgdrapi.so.2."""
    return f"libgdrapi.so.{version.split('.')[0]}"


@pytest.mark.static
@pytest.mark.evidence("load")
def test_libgdrapi_loads_and_is_the_declared_release(target):
    """libgdrapi.so.<major>, opened by soname as UCX and NCCL open it, loads with every dependency
    resolved, and gdr_runtime_get_version() of the loaded file is the manifest's version; on a
    trainbase image the io.trainbase.gdrcopy label names it too."""
    target.require("gdrcopy")
    declared = target.components["gdrcopy"]["version"]
    got = target.json_probe(f"{target.python} {PROBE_DIR}/libversions.py gdrcopy={soname(declared)}")["gdrcopy"]
    assert "error" not in got, f"{soname(declared)} does not load: {got.get('error')}"
    assert got["version"] == declared, (
        f"the manifest says GDRCopy {declared}, the loaded {got['path']} is {got['version']} (gdr_runtime_get_version)"
    )
    if not target.foreign:
        labelled = target.labels.get(LABEL)
        assert labelled == got["version"], f"{LABEL} is {labelled}, the loaded {got['path']} is {got['version']}"
