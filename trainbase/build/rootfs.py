"""Make a debootstrapped Debian tree look like the official image before it is imported:
docker-friendly apt/dpkg settings, deb822 sources with -updates and -security, no apt lists,
caches or host files, the official "-slim" path excludes, and the list of what is installed.
Pure filesystem work (tested on a fake tree); bootstrap.py runs debootstrap and the import."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

PACKAGE_LIST = "etc/trainbase/base-packages.txt"

# Same path sets the official "-slim" Debian images exclude (dpkg path-exclude).
SLIM_EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/groff/*",
    "/usr/share/info/*",
    "/usr/share/linda/*",
    "/usr/share/lintian/overrides/*",
    "/usr/share/locale/*",
    "/usr/share/man/*",
)
SLIM_INCLUDES = (
    "/usr/share/doc/*/copyright",
    "/usr/share/doc/kde/HTML/C/*",
    "/usr/share/gnome/help/*/C/*",
    "/usr/share/locale/all_languages",
    "/usr/share/locale/currency/*",
    "/usr/share/locale/l10n/*",
    "/usr/share/locale/languages",
    "/usr/share/locale/locale.alias",
    "/usr/share/omf/*/*-C.emf",
)


def _clear_dir(path: Path) -> None:
    if not path.is_dir() or path.is_symlink():
        return
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def write_file(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _sources_deb822(suite: str, mirror: str) -> str:
    rolling = suite in ("sid", "unstable", "experimental")
    suites = [suite] if rolling else [suite, f"{suite}-updates"]
    text = (
        f"Types: deb\nURIs: {mirror}\nSuites: {' '.join(suites)}\n"
        f"Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    if not rolling and suite not in ("buster", "oldoldstable") and mirror.rstrip("/").endswith("/debian"):
        sec = mirror.rstrip("/") + "-security"
        text += (
            f"\nTypes: deb\nURIs: {sec}\nSuites: {suite}-security\n"
            f"Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        )
    return text


def _slim_tree(root: Path, excludes: Sequence[str], includes: Sequence[str]) -> None:
    """Delete what dpkg ``path-exclude`` would not have installed (keeping
    ``path-include`` matches), then dangling links and empty directories."""

    def keep(rel: str) -> bool:
        return any(fnmatch.fnmatchcase(rel, pat) for pat in includes)

    def dangling(p: str) -> bool:
        target = os.readlink(p)
        full = str(root) + target if target.startswith("/") else os.path.join(os.path.dirname(p), target)
        return not os.path.lexists(full)

    for pat in excludes:
        base = root / pat.lstrip("/").rsplit("/", 1)[0]
        if not base.is_dir() or base.is_symlink():
            continue
        for dirpath, dirnames, filenames in os.walk(base, topdown=False):
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                p = os.path.join(dirpath, name)
                rel = "/" + os.path.relpath(p, root)
                if fnmatch.fnmatchcase(rel, pat) and not keep(rel):
                    os.unlink(p)
        changed = True
        while changed:
            changed = False
            for dirpath, dirnames, filenames in os.walk(base, topdown=False):
                for name in filenames + dirnames:
                    p = os.path.join(dirpath, name)
                    if os.path.islink(p):
                        if dangling(p):
                            os.unlink(p)
                            changed = True
                    elif os.path.isdir(p) and not os.listdir(p):
                        os.rmdir(p)
                        changed = True


def slim_rootfs(rootfs: str, suite: str, mirror: str, slim: bool) -> None:
    """Make a debootstrapped tree look like the official Debian image:
    docker-friendly apt/dpkg settings, deb822 sources, no apt lists or caches,
    no host files, and for ``slim`` the official "-slim" path excludes."""
    root = Path(rootfs)
    # host and build leftovers
    for rel in ("var/lib/apt/lists", "var/cache/apt", "dev", "tmp"):
        _clear_dir(root / rel)
    if (root / "debootstrap").is_dir():
        shutil.rmtree(root / "debootstrap")
    for rel in (
        "var/log/bootstrap.log",
        "var/log/apt/history.log",
        "var/log/apt/term.log",
        "var/log/alternatives.log",
        "var/log/dpkg.log",
        "etc/apt/apt.conf.d/01autoremove-kernels",
        "etc/machine-id",
    ):
        p = root / rel
        if p.is_file() or p.is_symlink():
            p.unlink()
    # resolv.conf / hostname were copied from the host; docker mounts its own
    for rel in ("etc/resolv.conf", "etc/hostname"):
        p = root / rel
        if p.is_file() and not p.is_symlink():
            p.write_text("")
    if (root / "tmp").is_dir():
        (root / "tmp").chmod(0o1777)
    # apt sources like the official image (deb822, -updates, -security)
    sources_list = root / "etc/apt/sources.list"
    if sources_list.exists():
        sources_list.unlink()
    write_file(root / "etc/apt/sources.list.d/debian.sources", _sources_deb822(suite, mirror))
    # docker-friendly package manager settings (as in the official images)
    write_file(
        root / "usr/sbin/policy-rc.d",
        "#!/bin/sh\n# no services start during package installs in image builds\nexit 101\n",
        0o755,
    )
    write_file(
        root / "etc/dpkg/dpkg.cfg.d/docker-apt-speedup",
        "# image builds need no fsync per unpacked file\nforce-unsafe-io\n",
    )
    write_file(
        root / "etc/apt/apt.conf.d/docker-autoremove-suggests",
        "// autoremove also what was only kept because something Suggests it\n"
        'Apt::AutoRemove::SuggestsImportant "false";\n',
    )
    clean = '"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true";'
    write_file(
        root / "etc/apt/apt.conf.d/docker-clean",
        "// like the official image: an implicit `apt-get clean` after every install.\n"
        "// Builds that use a cache mount on /var/cache/apt should delete this file.\n"
        f"DPkg::Post-Invoke {{ {clean} }};\nAPT::Update::Post-Invoke {{ {clean} }};\n"
        'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n',
    )
    write_file(
        root / "etc/apt/apt.conf.d/docker-gzip-indexes",
        '// keep package lists compressed on disk\nAcquire::GzipIndexes "true";\n',
    )
    write_file(root / "etc/apt/apt.conf.d/docker-no-languages", '// no Translation files\nAcquire::Languages "none";\n')
    if slim:
        cfg = [
            '# "slim" variant: files unnecessary in containers are excluded,',
            "# and this configuration keeps them that way.",
        ]
        cfg += [f"path-exclude {p}" for p in SLIM_EXCLUDES]
        cfg += [f"path-include {p}" for p in SLIM_INCLUDES]
        write_file(root / "etc/dpkg/dpkg.cfg.d/docker", "\n".join(cfg) + "\n")
        _slim_tree(root, SLIM_EXCLUDES, SLIM_INCLUDES)


def package_list(rootfs: str) -> str:
    """`name version` per installed package, sorted: what the bootstrap put in the image."""
    status = Path(rootfs, "var/lib/dpkg/status").read_text(errors="replace")
    pkgs = []
    for block in status.split("\n\n"):
        fields = dict(re.findall(r"(?m)^(Package|Version|Status): (.*)$", block))
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            pkgs.append(f"{fields['Package']} {fields.get('Version', '?')}")
    return "\n".join(sorted(pkgs)) + "\n"
