"""Base images that no registry serves here: a Debian root filesystem made with debootstrap
from Debian's mirror, trimmed like the official image (its "-slim" variant when the tag says
slim) and imported into the engine. The image records what it was made from: the suite, the
mirror and its dpkg package list (labels, and /etc/trainbase/base-packages.txt inside it), so
two bootstraps of the same tag can be told apart.

Needs root and debootstrap (scripts/setup.sh installs it); the engine is reached through
trainbase_common.engine only.

    python -m trainbase.bootstrap debian:12.15-slim bookworm
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from trainbase_common import engine

Log = Callable[[str], None]

DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEBOOTSTRAP_SCRIPTS = Path("/usr/share/debootstrap/scripts")

# Debian suites debootstrap can build from a Debian mirror, by codename/alias.
DEBIAN_SUITES = frozenset({
    "buster", "bullseye", "bookworm", "trixie", "forky", "duke",
    "sid", "unstable", "experimental", "testing", "stable",
    "oldstable", "oldoldstable",
})
# Ubuntu codenames: never bootstrappable here (Ubuntu's archive is not used).
UBUNTU_SUITES = frozenset({
    "trusty", "xenial", "bionic", "cosmic", "disco", "eoan", "focal", "groovy",
    "hirsute", "impish", "jammy", "kinetic", "lunar", "mantic", "noble",
    "oracular", "plucky", "questing", "resolute",
})

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


PACKAGE_LIST = "etc/trainbase/base-packages.txt"


class BootstrapError(Exception):
    """A base image could not be made available; the message says why."""


def _tail(text: str, n: int = 15) -> str:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return "\n".join("    " + ln for ln in lines[-n:])


def _sbin_path() -> str:
    parts = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join([p for p in parts if p] + [d for d in ("/usr/local/sbin", "/usr/sbin", "/sbin") if d not in parts])


def check_debian_suite(suite: str, ref: str = "") -> str | None:
    """Validate that ``suite`` is a Debian suite debootstrap can build from a
    Debian mirror.  Returns an explicit debootstrap script path when the
    installed debootstrap has none for it (a newer Debian codename), else None.
    """
    what = f"{ref} " if ref else ""
    if not re.fullmatch(r"[a-z][a-z0-9.+-]*", suite or ""):
        raise BootstrapError(f"invalid suite name {suite!r}")
    if suite in UBUNTU_SUITES:
        raise BootstrapError(
            f"{what}cannot be bootstrapped here: {suite} is an Ubuntu suite and only "
            f"Debian suites can be bootstrapped locally; the image must come from a registry")
    script = DEBOOTSTRAP_SCRIPTS / suite
    if script.exists():
        family = script.resolve().name
        if family != "sid":
            raise BootstrapError(
                f"{what}cannot be bootstrapped here: {suite} is not a Debian suite "
                f"(debootstrap script family {family!r}); only Debian suites can be "
                f"bootstrapped locally, the image must come from a registry")
        return None
    if suite in DEBIAN_SUITES:
        sid = DEBOOTSTRAP_SCRIPTS / "sid"
        return str(sid) if sid.exists() else None
    raise BootstrapError(
        f"{what}cannot be bootstrapped here: unknown suite {suite!r} (known Debian "
        f"suites: {', '.join(sorted(DEBIAN_SUITES))}); otherwise the image must come "
        f"from a registry")


def _label_safe(value: str, what: str) -> str:
    if not value or re.search(r"[\s\"'\\]", value):
        raise BootstrapError(f"{what} {value!r} must be non-empty without spaces or quotes")
    return value


def _mounts_under(root: str) -> list:
    root = os.path.realpath(root)
    found = []
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 1:
                mp = parts[1].encode().decode("unicode_escape")
                if mp == root or mp.startswith(root + "/"):
                    found.append(mp)
    except OSError:
        pass
    return sorted(found, key=len, reverse=True)


def _remove_tree(path: str, log: Log) -> None:
    """rm -rf, but first detach anything still mounted inside (an interrupted
    debootstrap can leave /proc or /sys mounted in the target)."""
    if not os.path.exists(path):
        return
    for mp in _mounts_under(path):
        subprocess.run(["umount", "-l", mp], capture_output=True, timeout=30)
    left = _mounts_under(path)
    if left:
        log(f"warning: not removing {path}: still mounted: {', '.join(left)}")
        return
    shutil.rmtree(path, ignore_errors=True)


def _clear_dir(path: Path) -> None:
    if not path.is_dir() or path.is_symlink():
        return
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _sources_deb822(suite: str, mirror: str) -> str:
    rolling = suite in ("sid", "unstable", "experimental")
    suites = [suite] if rolling else [suite, f"{suite}-updates"]
    text = (f"Types: deb\nURIs: {mirror}\nSuites: {' '.join(suites)}\n"
            f"Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    if not rolling and suite not in ("buster", "oldoldstable") and mirror.rstrip("/").endswith("/debian"):
        sec = mirror.rstrip("/") + "-security"
        text += (f"\nTypes: deb\nURIs: {sec}\nSuites: {suite}-security\n"
                 f"Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
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
    for rel in ("var/log/bootstrap.log", "var/log/apt/history.log", "var/log/apt/term.log",
                "var/log/alternatives.log", "var/log/dpkg.log",
                "etc/apt/apt.conf.d/01autoremove-kernels", "etc/machine-id"):
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
    _write(root / "etc/apt/sources.list.d/debian.sources", _sources_deb822(suite, mirror))
    # docker-friendly package manager settings (as in the official images)
    _write(root / "usr/sbin/policy-rc.d",
           "#!/bin/sh\n# no services start during package installs in image builds\nexit 101\n", 0o755)
    _write(root / "etc/dpkg/dpkg.cfg.d/docker-apt-speedup",
           "# image builds need no fsync per unpacked file\nforce-unsafe-io\n")
    _write(root / "etc/apt/apt.conf.d/docker-autoremove-suggests",
           "// autoremove also what was only kept because something Suggests it\n"
           "Apt::AutoRemove::SuggestsImportant \"false\";\n")
    clean = '"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true";'
    _write(root / "etc/apt/apt.conf.d/docker-clean",
           "// like the official image: an implicit `apt-get clean` after every install.\n"
           "// Builds that use a cache mount on /var/cache/apt should delete this file.\n"
           f"DPkg::Post-Invoke {{ {clean} }};\nAPT::Update::Post-Invoke {{ {clean} }};\n"
           "Dir::Cache::pkgcache \"\";\nDir::Cache::srcpkgcache \"\";\n")
    _write(root / "etc/apt/apt.conf.d/docker-gzip-indexes",
           "// keep package lists compressed on disk\nAcquire::GzipIndexes \"true\";\n")
    _write(root / "etc/apt/apt.conf.d/docker-no-languages",
           "// no Translation files\nAcquire::Languages \"none\";\n")
    if slim:
        cfg = ["# \"slim\" variant: files unnecessary in containers are excluded,",
               "# and this configuration keeps them that way."]
        cfg += [f"path-exclude {p}" for p in SLIM_EXCLUDES]
        cfg += [f"path-include {p}" for p in SLIM_INCLUDES]
        _write(root / "etc/dpkg/dpkg.cfg.d/docker", "\n".join(cfg) + "\n")
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


def _import(rootfs: str, ref: str, suite: str, mirror: str, packages: str) -> None:
    digest = hashlib.sha256(packages.encode()).hexdigest()
    changes = ['CMD ["bash"]',
               f"LABEL io.trainbase.base.source=debootstrap io.trainbase.base.suite={suite} "
               f"io.trainbase.base.mirror={mirror} io.trainbase.base.packages-sha256={digest}"]
    with tempfile.NamedTemporaryFile(suffix=".tar", dir=os.environ.get("TMPDIR") or "/var/tmp") as tmp:
        with tarfile.open(tmp.name, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(rootfs, arcname=".", filter=lambda ti: ti)
        try:
            engine.import_rootfs(tmp.name, ref, changes)
        except engine.EngineError as e:
            raise BootstrapError(f"importing {ref} failed: {e}") from None


def _tag_of(ref: str) -> str:
    last = ref.rsplit("/", 1)[-1]
    return last.split("@", 1)[0].split(":", 1)[1] if ":" in last.split("@", 1)[0] else ""


def ensure_base_image(ref: str, suite: str | None = None, mirror: str = DEFAULT_MIRROR, log: Log = print) -> str:
    """Make ``ref`` available in the engine: "present", "pulled" or "bootstrapped"."""
    if not engine.available():
        raise BootstrapError("no container engine answers: run scripts/setup.sh"
                             + (f" (DOCKER_HOST={os.environ['DOCKER_HOST']})" if os.environ.get("DOCKER_HOST") else ""))
    if engine.image_exists(ref):
        log(f"{ref}: present")
        return "present"
    log(f"{ref}: not present, trying to pull it")
    t0 = time.monotonic()
    try:
        engine.pull(ref)
        log(f"{ref}: pulled in {time.monotonic() - t0:.1f} s")
        return "pulled"
    except engine.EngineError as e:
        why = str(e).splitlines()[0][:300]
    log(f"{ref}: pull failed after {time.monotonic() - t0:.1f} s: {why}")
    if not suite:
        raise BootstrapError(f"{ref} is not in the engine and could not be pulled ({why}); it must come from a "
                             f"registry (only Debian suites can be bootstrapped locally)")
    check_debian_suite(suite, ref)
    _label_safe(suite, "suite")
    _label_safe(mirror, "mirror")
    if os.geteuid() != 0:
        raise BootstrapError(f"bootstrapping {ref} with debootstrap needs root")
    debootstrap = shutil.which("debootstrap", path=_sbin_path())
    if debootstrap is None:
        raise BootstrapError(f"bootstrapping {ref} needs debootstrap: run scripts/setup.sh (it installs it)")
    script = check_debian_suite(suite, ref)
    tmp = tempfile.mkdtemp(prefix="trainbase-rootfs-", dir=os.environ.get("TMPDIR") or "/var/tmp")
    rootfs = os.path.join(tmp, "rootfs")
    try:
        cmd = [debootstrap, "--variant=minbase", suite, rootfs, mirror] + ([script] if script else [])
        log(f"{ref}: debootstrap --variant=minbase {suite} {rootfs} {mirror}")
        t1 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PATH=_sbin_path()))
        if r.returncode != 0:
            detail = _tail(r.stdout + r.stderr)
            dlog = Path(rootfs, "debootstrap", "debootstrap.log")
            if dlog.exists():
                detail += f"\n  {dlog}:\n" + _tail(dlog.read_text(errors="replace"))
            raise BootstrapError(f"debootstrap of {suite} from {mirror} failed (exit {r.returncode}):\n{detail}")
        t_boot = time.monotonic() - t1
        slim = "slim" in _tag_of(ref)
        slim_rootfs(rootfs, suite, mirror, slim=slim)
        have = Path(rootfs, "etc/debian_version").read_text().strip() if Path(rootfs, "etc/debian_version").exists() else "?"
        m = re.match(r"(\d+(?:\.\d+)*)", _tag_of(ref))
        if m and not (have == m.group(1) or have.startswith(m.group(1) + ".")):
            log(f"{ref}: note: the tag says {m.group(1)} but the mirror's {suite} is {have} "
                f"(a mirror serves only the current point release)")
        packages = package_list(rootfs)
        _write(Path(rootfs, PACKAGE_LIST), packages)
        t2 = time.monotonic()
        _import(rootfs, ref, suite, mirror, packages)
        info = engine.inspect_image(ref)
        log(f"{ref}: bootstrapped Debian {have} ({suite}{', slim' if slim else ''}, {packages.count(chr(10))} "
            f"packages, list in /{PACKAGE_LIST}): debootstrap {t_boot:.0f} s, import {time.monotonic() - t2:.0f} s"
            + (f", size {info.size / 1e6:.0f} MB" if info else ""))
    finally:
        _remove_tree(tmp, log)
    return "bootstrapped"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainbase.bootstrap",
                                 description="make a base image available: present, pulled, or debootstrapped")
    ap.add_argument("ref", help="image reference, e.g. debian:12.15-slim")
    ap.add_argument("suite", nargs="?", help="Debian suite to bootstrap if the pull fails, e.g. bookworm")
    ap.add_argument("--mirror", default=DEFAULT_MIRROR)
    args = ap.parse_args(argv)
    try:
        print(ensure_base_image(args.ref, args.suite, args.mirror,
                                log=lambda s: print(f"trainbase: {s}", file=sys.stderr, flush=True)))
    except BootstrapError as e:
        print(f"trainbase: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
