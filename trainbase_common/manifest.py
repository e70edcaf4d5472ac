"""The image manifest's contract, shared by the build (which writes /etc/trainbase/manifest.json
and the OCI labels into every image) and the conformance suite (which checks that the labels
say what the manifest says): the one definition of manifest -> labels."""

from __future__ import annotations

from typing import Any

MANIFEST_PATH = "/etc/trainbase/manifest.json"


def labels(manifest: dict[str, Any]) -> dict[str, str]:
    """OCI labels from the manifest (flat, stable order)."""
    c = manifest["components"]
    out = {
        "org.opencontainers.image.title": manifest["name"],
        "org.opencontainers.image.description": "trainbase distributed-training image (see /etc/trainbase/manifest.json)",
        "io.trainbase.os": c["os"]["id"],
        # manifests written before the platform axis are amd64 images
        "io.trainbase.platform": manifest.get("platform", "linux/amd64"),
        "io.trainbase.cuda": c["cuda"]["version"],
        "io.trainbase.cudnn": c["cudnn"]["version"],
        "io.trainbase.nccl": c["nccl"]["version"],
        "io.trainbase.mpi": f"{c['mpi']['kind']}-{c['mpi']['version']}",
        # the UCX the MPI loads (a wheel's bundled copy where it has one), not the image's tools'
        "io.trainbase.ucx": c["mpi"].get("ucx", c["ucx"])["version"],
        "io.trainbase.ib": c["ib"]["kind"],
        "io.trainbase.python": c["python"]["version"],
    }
    if "gdrcopy" in c:  # the fabric libraries an image carries (manifests before issue 70 have none)
        out["io.trainbase.gdrcopy"] = c["gdrcopy"]["version"]
    if "libfabric" in c:
        out["io.trainbase.libfabric"] = c["libfabric"]["version"]
    if "nccl_net_plugin" in c:  # the NCCL network plugin NCCL takes on its fabric: name-version
        p = c["nccl_net_plugin"]
        out["io.trainbase.nccl-net-plugin"] = f"{p['name']}-{p['version']}"
    if "nccl_tests" in c:  # nccl-tests' benchmarks, where the row has nvcc to build them
        out["io.trainbase.nccl-tests"] = c["nccl_tests"]["version"]
    for fw, ver in manifest["frameworks"].items():
        out[f"io.trainbase.framework.{fw}"] = ver
    return out
