"""Base images that no registry serves here: a Debian root filesystem made with debootstrap
from Debian's mirror, trimmed like the official image (its "-slim" variant when the tag says
slim) and imported into the engine under trainbase's OWN name (debian:12.15-slim ->
trainbase-bootstrap/debian:12.15-slim), never under the official one; the Dockerfiles of rows
that allow it take the base as a build argument (TRAINBASE_BASE), which the build sets to this
image where the official one cannot be had. The image records what it was made from: the
suite, the mirror and its dpkg package list (labels, and /etc/trainbase/base-packages.txt
inside it), so two bootstraps of the same tag can be told apart.

Needs root and debootstrap (scripts/setup.sh installs it); the engine is reached through
trainbase_common.engine only.

    python -m trainbase.build.bootstrap debian:12.15-slim bookworm
"""

from __future__ import annotations

import argparse
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
from typing import Any

from trainbase_common import emulation, engine

from .rootfs import PACKAGE_LIST, package_list, slim_rootfs, write_file

Log = Callable[[str], object]  # print, or a writer: what it returns is not read

DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEBOOTSTRAP_SCRIPTS = Path("/usr/share/debootstrap/scripts")

# Debian suites debootstrap can build from a Debian mirror, by codename/alias.
DEBIAN_SUITES = frozenset(
    {
        "buster",
        "bullseye",
        "bookworm",
        "trixie",
        "forky",
        "duke",
        "sid",
        "unstable",
        "experimental",
        "testing",
        "stable",
        "oldstable",
        "oldoldstable",
    }
)
# Ubuntu codenames: never bootstrappable here (Ubuntu's archive is not used).
UBUNTU_SUITES = frozenset(
    {
        "trusty",
        "xenial",
        "bionic",
        "cosmic",
        "disco",
        "eoan",
        "focal",
        "groovy",
        "hirsute",
        "impish",
        "jammy",
        "kinetic",
        "lunar",
        "mantic",
        "noble",
        "oracular",
        "plucky",
        "questing",
        "resolute",
    }
)


BOOTSTRAP_NAMESPACE = "trainbase-bootstrap"


def bootstrap_ref(ref: str, arch: str | None = None) -> str:
    """trainbase's own name for its bootstrap of ``ref``: debian:12.15-slim ->
    trainbase-bootstrap/debian:12.15-slim; another architecture's under its own name
    (trainbase-bootstrap/arm64/debian:12.15-slim): an engine's tag holds one platform."""
    own = ref.rsplit("/", 1)[-1]
    if arch and not emulation.is_native(arch):
        return f"{BOOTSTRAP_NAMESPACE}/{arch}/{own}"
    return f"{BOOTSTRAP_NAMESPACE}/{own}"


def _is_our_bootstrap(ref: str) -> bool:
    info = engine.inspect_image(ref)
    return info is not None and info.labels.get("io.trainbase.base.source") == "debootstrap"


class BootstrapError(Exception):
    """A base image could not be made available; the message says why."""


def _tail(text: str, n: int = 15) -> str:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return "\n".join("    " + ln for ln in lines[-n:])


def _sbin_path() -> str:
    parts = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(
        [p for p in parts if p] + [d for d in ("/usr/local/sbin", "/usr/sbin", "/sbin") if d not in parts]
    )


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
            f"Debian suites can be bootstrapped locally; the image must come from a registry"
        )
    script = DEBOOTSTRAP_SCRIPTS / suite
    if script.exists():
        family = script.resolve().name
        if family != "sid":
            raise BootstrapError(
                f"{what}cannot be bootstrapped here: {suite} is not a Debian suite "
                f"(debootstrap script family {family!r}); only Debian suites can be "
                f"bootstrapped locally, the image must come from a registry"
            )
        return None
    if suite in DEBIAN_SUITES:
        sid = DEBOOTSTRAP_SCRIPTS / "sid"
        return str(sid) if sid.exists() else None
    raise BootstrapError(
        f"{what}cannot be bootstrapped here: unknown suite {suite!r} (known Debian "
        f"suites: {', '.join(sorted(DEBIAN_SUITES))}); otherwise the image must come "
        f"from a registry"
    )


def _label_safe(value: str, what: str) -> str:
    if not value or re.search(r"[\s\"'\\]", value):
        raise BootstrapError(f"{what} {value!r} must be non-empty without spaces or quotes")
    return value


def _mounts_under(root: str) -> list[Any]:
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
        subprocess.run(["umount", "-l", mp], capture_output=True, timeout=30, check=False)
    left = _mounts_under(path)
    if left:
        log(f"warning: not removing {path}: still mounted: {', '.join(left)}")
        return
    shutil.rmtree(path, ignore_errors=True)


def _import(rootfs: str, ref: str, suite: str, mirror: str, packages: str, arch: str | None = None) -> None:
    digest = hashlib.sha256(packages.encode()).hexdigest()
    labels = {
        "io.trainbase.base.source": "debootstrap",
        "io.trainbase.base.suite": suite,
        "io.trainbase.base.mirror": mirror,
        "io.trainbase.base.packages-sha256": digest,
    }
    if arch and not emulation.is_native(arch):
        _import_foreign(rootfs, ref, labels, arch)
        return
    changes = ['CMD ["bash"]', "LABEL " + " ".join(f"{k}={v}" for k, v in labels.items())]
    with tempfile.NamedTemporaryFile(suffix=".tar", dir=os.environ.get("TMPDIR") or "/var/tmp") as tmp:  # noqa: S108 -- tempfile picks the private name
        with tarfile.open(tmp.name, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(rootfs, arcname=".", filter=lambda ti: ti)
        try:
            engine.import_rootfs(tmp.name, ref, changes)
        except engine.EngineError as e:
            raise BootstrapError(f"importing {ref} failed: {e}") from None


def _import_foreign(rootfs: str, ref: str, labels: dict[str, str], arch: str) -> None:
    """Another architecture's root filesystem as an image of THAT platform. `docker import`
    records the host's architecture whatever it is asked (Docker 20.10 ignores the API's
    platform parameter), and BuildKit then refuses or re-pulls the base of a --platform build;
    a `FROM scratch` + `ADD` build with --platform runs nothing under emulation and writes the
    right architecture into the image config."""
    from trainbase_common import buildkit

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR") or "/var/tmp") as ctx:  # noqa: S108 -- tempfile picks the private name
        with tarfile.open(os.path.join(ctx, "rootfs.tar"), "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(rootfs, arcname=".", filter=lambda ti: ti)
        Path(ctx, "Dockerfile").write_text('FROM scratch\nADD rootfs.tar /\nCMD ["bash"]\n')
        cmd, env = buildkit.build_command(
            "Dockerfile",
            ref,
            labels=labels,
            build_args={},
            target=None,
            secrets=None,
            network=None,
            no_cache=False,
            platform=f"linux/{arch}",
            context=ctx,
        )
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ctx, check=False)
        if r.returncode != 0:
            raise BootstrapError(f"importing {ref} ({arch}) failed:\n{_tail(r.stdout + r.stderr)}")


def packages_of(image: str) -> list[str]:
    """The dpkg list a trainbase bootstrap recorded in itself ("name version" lines)."""
    import uuid

    cid = engine.run_detached(
        image,
        ["sleep", "infinity"],
        name=f"tb-base-{uuid.uuid4().hex[:8]}",
        labels={"io.trainbase.base-lock": "1"},
        opts=engine.RunOptions(init=False),
    )
    try:
        r = engine.exec_in(cid, ["cat", "/" + PACKAGE_LIST])
    finally:
        engine.remove_container(cid)
    if r.returncode != 0:
        raise BootstrapError(f"{image} has no /{PACKAGE_LIST}: not a trainbase bootstrap ({r.stderr.strip()[:200]})")
    return [ln for ln in r.stdout.splitlines() if ln.strip()]


def _tag_of(ref: str) -> str:
    last = ref.rsplit("/", 1)[-1]
    return last.split("@", 1)[0].split(":", 1)[1] if ":" in last.split("@", 1)[0] else ""


def ensure_base_image(
    ref: str,
    suite: str | None = None,
    mirror: str = DEFAULT_MIRROR,
    log: Log = print,
    bootstrap_only: bool = False,
    arch: str | None = None,
) -> tuple[str, str]:
    """Make a base for ``ref`` available: (how, the reference to build FROM). How is "present"
    or "pulled" (the official image), or "bootstrapped" / "bootstrap present" (trainbase's own
    bootstrap, under bootstrap_ref(ref)). ``bootstrap_only``: the base lock says the row is
    built FROM trainbase's bootstrap, so the official image is not even looked at. ``arch``:
    a platform other than the host's -- an engine tag holds the host's platform, so a registry
    base is left for BuildKit to resolve from its index, and a bootstrap is made for ``arch``
    (debootstrap runs the second stage under qemu)."""
    foreign = bool(arch) and not emulation.is_native(arch or "")
    if foreign and not bootstrap_only and not suite:
        log(f"{ref} ({arch}): resolved by BuildKit from the registry's index at build time")
        return "registry index", ref
    if not engine.available():
        raise BootstrapError(
            "no container engine answers: run scripts/setup.sh"
            + (f" (DOCKER_HOST={os.environ['DOCKER_HOST']})" if os.environ.get("DOCKER_HOST") else "")
        )
    if bootstrap_only:
        if not suite:
            raise BootstrapError(f"{ref} is locked to trainbase's bootstrap, but its row names no bootstrap suite")
        log(f"{ref}: locked to trainbase's bootstrap (locks/bases.json)")
    elif foreign:
        log(f"{ref} ({arch}): the engine holds one platform per tag; using trainbase's {arch} bootstrap")
    elif engine.image_exists(ref):
        if not _is_our_bootstrap(ref):
            log(f"{ref}: present")
            return "present", ref
        log(f"{ref}: ignored: an earlier trainbase bootstrap imported under the official name")
    else:
        log(f"{ref}: not present, trying to pull it")
        t0 = time.monotonic()
        try:
            engine.pull(ref)
            log(f"{ref}: pulled in {time.monotonic() - t0:.1f} s")
            return "pulled", ref
        except engine.EngineError as e:
            why = str(e).splitlines()[0][:300]
        log(f"{ref}: pull failed after {time.monotonic() - t0:.1f} s: {why}")
        if not suite:
            raise BootstrapError(
                f"{ref} is not in the engine and could not be pulled ({why}); it must come from a "
                f"registry (only Debian suites can be bootstrapped locally)"
            )
    if not suite:  # (bootstrap_only without a suite was refused above)
        raise BootstrapError(
            f"{ref} in the engine is a trainbase bootstrap, not the official image, and no "
            "suite was given to bootstrap it again"
        )
    own = bootstrap_ref(ref, arch)
    if _is_our_bootstrap(own):
        info = engine.inspect_image(own)
        labels = info.labels if info else {}
        log(
            f"{ref}: using trainbase's own bootstrap {own} (packages sha256 "
            f"{labels.get('io.trainbase.base.packages-sha256', '?')[:12]})"
        )
        return "bootstrap present", own
    check_debian_suite(suite, ref)
    _label_safe(suite, "suite")
    _label_safe(mirror, "mirror")
    if os.geteuid() != 0:
        raise BootstrapError(f"bootstrapping {ref} with debootstrap needs root")
    debootstrap = shutil.which("debootstrap", path=_sbin_path())
    if debootstrap is None:
        raise BootstrapError(f"bootstrapping {ref} needs debootstrap: run scripts/setup.sh (it installs it)")
    script = check_debian_suite(suite, ref)
    tmp = tempfile.mkdtemp(prefix="trainbase-rootfs-", dir=os.environ.get("TMPDIR") or "/var/tmp")  # noqa: S108 -- tempfile picks the private name
    rootfs = os.path.join(tmp, "rootfs")
    try:
        arch_opt = [f"--arch={arch}"] if foreign else []
        cmd = [debootstrap, "--variant=minbase", *arch_opt, suite, rootfs, mirror] + ([script] if script else [])
        log(
            f"{ref}: debootstrap --variant=minbase {' '.join(arch_opt + [''])}{suite} {rootfs} {mirror}"
            + (" (second stage under qemu)" if foreign else "")
        )
        t1 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PATH=_sbin_path()), check=False)
        if r.returncode != 0:
            detail = _tail(r.stdout + r.stderr)
            dlog = Path(rootfs, "debootstrap", "debootstrap.log")
            if dlog.exists():
                detail += f"\n  {dlog}:\n" + _tail(dlog.read_text(errors="replace"))
            raise BootstrapError(f"debootstrap of {suite} from {mirror} failed (exit {r.returncode}):\n{detail}")
        t_boot = time.monotonic() - t1
        slim = "slim" in _tag_of(ref)
        slim_rootfs(rootfs, suite, mirror, slim=slim)
        have = (
            Path(rootfs, "etc/debian_version").read_text().strip()
            if Path(rootfs, "etc/debian_version").exists()
            else "?"
        )
        m = re.match(r"(\d+(?:\.\d+)*)", _tag_of(ref))
        if m and not (have == m.group(1) or have.startswith(m.group(1) + ".")):
            log(
                f"{ref}: note: the tag says {m.group(1)} but the mirror's {suite} is {have} "
                f"(a mirror serves only the current point release)"
            )
        packages = package_list(rootfs)
        write_file(Path(rootfs, PACKAGE_LIST), packages)
        t2 = time.monotonic()
        _import(rootfs, own, suite, mirror, packages, arch)
        info = engine.inspect_image(own)
        log(
            f"{ref}: bootstrapped as {own}: Debian {have} ({suite}{', slim' if slim else ''}, {packages.count(chr(10))} "
            f"packages, list in /{PACKAGE_LIST}): debootstrap {t_boot:.0f} s, import {time.monotonic() - t2:.0f} s"
            + (f", size {info.size / 1e6:.0f} MB" if info else "")
        )
    finally:
        _remove_tree(tmp, log)
    return "bootstrapped", own


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m trainbase.build.bootstrap",
        description="make a base image available: present, pulled, or debootstrapped",
    )
    ap.add_argument("ref", help="image reference, e.g. debian:12.15-slim")
    ap.add_argument("suite", nargs="?", help="Debian suite to bootstrap if the pull fails, e.g. bookworm")
    ap.add_argument("--mirror", default=DEFAULT_MIRROR)
    args = ap.parse_args(argv)
    try:
        how, use = ensure_base_image(
            args.ref, args.suite, args.mirror, log=lambda s: print(f"trainbase: {s}", file=sys.stderr, flush=True)
        )
        print(f"{how} {use}")
    except BootstrapError as e:
        print(f"trainbase: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
