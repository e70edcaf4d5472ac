"""The InfiniBand userspace: the distro's rdma-core, or NVIDIA DOCA-OFED from its repository
(whose signing key is a pinned artifact)."""

from __future__ import annotations

from .facts import Block, Facts


def block(f: Facts) -> Block:
    ibr = f.ibr
    repo = ibr.repo.format(os_family=f.osr.family, os_version=f.os_version, arch=f.plat.doca_repo) if ibr.repo else None
    return Block(
        {
            "key": f.cell.ib,
            "kind": ibr.kind,
            "providers": list(ibr.providers),
            "version": ibr.version,
            "package_version": ibr.package_version,
            "repo": repo,
            "key_artifact": f.artifact(ibr.key),
        },
        artifacts=(ibr.key,) if ibr.key else (),
    )
