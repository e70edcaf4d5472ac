"""Base images by debootstrap (trainbase.build.bootstrap), without root, network or an engine: the
suite checks, the trimmed tree, the package list, and what happens when the image is present,
pullable, or neither (the adapter's calls faked)."""

from __future__ import annotations

import os

import pytest

from trainbase.build import bootstrap, rootfs
from trainbase_common import engine


@pytest.fixture
def no_engine_calls(monkeypatch):
    """Every adapter call the module makes, faked; what was called is recorded."""
    calls = []
    monkeypatch.setattr(engine, "available", lambda: True)
    monkeypatch.setattr(engine, "image_exists", lambda ref: calls.append(("exists", ref)) or False)

    def pull(ref):
        calls.append(("pull", ref))
        raise engine.EngineAPIError(500, 'Get "https://registry-1.docker.io/v2/": dial tcp: no such host')

    monkeypatch.setattr(engine, "pull", pull)
    return calls


def _image(labels):
    return engine.ImageInfo(id="sha256:" + "1" * 64, size=75_000_000, labels=labels, env={}, raw={})


def test_base_present(no_engine_calls, monkeypatch):
    monkeypatch.setattr(engine, "image_exists", lambda ref: True)
    monkeypatch.setattr(engine, "inspect_image", lambda ref: _image({}))
    assert bootstrap.ensure_base_image("debian:12-slim", "bookworm", log=lambda m: None) == (
        "present",
        "debian:12-slim",
    )


def test_base_pulled(no_engine_calls, monkeypatch):
    monkeypatch.setattr(engine, "pull", lambda ref: None)
    assert bootstrap.ensure_base_image("ubuntu:22.04", None, log=lambda m: None) == ("pulled", "ubuntu:22.04")


def test_bootstrap_has_trainbase_s_own_name():
    assert bootstrap.bootstrap_ref("debian:12.15-slim") == "trainbase-bootstrap/debian:12.15-slim"
    assert bootstrap.bootstrap_ref("mirror.example/library/debian:12") == "trainbase-bootstrap/debian:12"


def test_an_old_bootstrap_under_the_official_name_is_not_taken_for_the_official_image(no_engine_calls, monkeypatch):
    """Earlier trainbase versions imported their bootstrap AS debian:12.15-slim: that image is
    ignored; trainbase's own bootstrap (its own name) is what the build uses."""
    ours = {"io.trainbase.base.source": "debootstrap", "io.trainbase.base.packages-sha256": "ab" * 32}
    monkeypatch.setattr(engine, "image_exists", lambda ref: True)
    monkeypatch.setattr(engine, "inspect_image", lambda ref: _image(ours))
    logged = []
    assert bootstrap.ensure_base_image("debian:12.15-slim", "bookworm", log=logged.append) == (
        "bootstrap present",
        "trainbase-bootstrap/debian:12.15-slim",
    )
    assert any("ignored: an earlier trainbase bootstrap" in m for m in logged)
    assert not [c for c in no_engine_calls if c[0] == "pull"]


def test_base_unpullable_without_suite_must_come_from_registry(no_engine_calls):
    with pytest.raises(bootstrap.BootstrapError) as ei:
        bootstrap.ensure_base_image("nvidia/cuda:12.4.1-runtime-ubuntu22.04", None, log=lambda m: None)
    assert "must come from a registry" in str(ei.value) and "no such host" in str(ei.value)


def test_base_ubuntu_suite_refused(no_engine_calls):
    with pytest.raises(bootstrap.BootstrapError, match="Ubuntu suite.*must come from a registry"):
        bootstrap.ensure_base_image("ubuntu:22.04", "jammy", log=lambda m: None)


def test_base_without_engine(monkeypatch):
    monkeypatch.setattr(engine, "available", lambda: False)
    with pytest.raises(bootstrap.BootstrapError, match="no container engine answers: run scripts/setup.sh"):
        bootstrap.ensure_base_image("debian:12", "bookworm", log=lambda m: None)


def test_package_list_reads_dpkg_status(tmp_path):
    status = tmp_path / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_text(
        "Package: zlib1g\nStatus: install ok installed\nVersion: 1:1.2.13\n\n"
        "Package: gone\nStatus: deinstall ok config-files\nVersion: 1\n\n"
        "Package: bash\nStatus: install ok installed\nVersion: 5.2.15-2+b7\n"
    )
    assert rootfs.package_list(str(tmp_path)) == "bash 5.2.15-2+b7\nzlib1g 1:1.2.13\n"


def test_check_debian_suite(tmp_path, monkeypatch):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "sid").write_text("")
    (scripts / "gutsy").write_text("")
    (scripts / "bookworm").symlink_to("sid")
    (scripts / "lunar-ish").symlink_to("gutsy")
    monkeypatch.setattr(bootstrap, "DEBOOTSTRAP_SCRIPTS", scripts)
    assert bootstrap.check_debian_suite("bookworm") is None
    # a Debian codename this debootstrap has no script for: use sid's
    assert bootstrap.check_debian_suite("forky") == str(scripts / "sid")
    with pytest.raises(bootstrap.BootstrapError, match="not a Debian suite"):
        bootstrap.check_debian_suite("lunar-ish")
    with pytest.raises(bootstrap.BootstrapError, match="Ubuntu"):
        bootstrap.check_debian_suite("noble")
    with pytest.raises(bootstrap.BootstrapError, match="unknown suite"):
        bootstrap.check_debian_suite("nosuchsuite")
    with pytest.raises(bootstrap.BootstrapError, match="invalid suite"):
        bootstrap.check_debian_suite("Bookworm; rm -rf /")


def test_sources_deb822():
    s = rootfs._sources_deb822("bookworm", "http://deb.debian.org/debian")
    assert "Suites: bookworm bookworm-updates" in s
    assert "URIs: http://deb.debian.org/debian-security" in s
    assert "Suites: bookworm-security" in s
    sid = rootfs._sources_deb822("sid", "http://deb.debian.org/debian")
    assert "Suites: sid\n" in sid and "security" not in sid
    other = rootfs._sources_deb822("trixie", "http://mirror.example/debian-mirror")
    assert "security" not in other


@pytest.mark.parametrize(
    "ref,tag",
    [
        ("debian:12.12-slim", "12.12-slim"),
        ("localhost:5000/debian:12", "12"),
        ("localhost:5000/debian", ""),
        ("debian@sha256:abc", ""),
    ],
)
def test_tag_of(ref, tag):
    assert bootstrap._tag_of(ref) == tag


def test_slim_rootfs(tmp_path):
    root = tmp_path / "rootfs"
    files = {
        "usr/share/doc/bash/copyright": "c",
        "usr/share/doc/bash/changelog.gz": "x",
        "usr/share/man/man1/bash.1.gz": "x",
        "usr/share/locale/de/LC_MESSAGES/bash.mo": "x",
        "usr/share/locale/locale.alias": "keep",
        "var/lib/apt/lists/deb.debian.org_dists_bookworm_InRelease": "x",
        "var/cache/apt/pkgcache.bin": "x",
        "etc/apt/sources.list": "deb http://deb.debian.org/debian bookworm main\n",
        "etc/resolv.conf": "nameserver 10.0.0.1\n",
        "etc/hostname": "buildhost\n",
        "var/log/bootstrap.log": "x",
        "usr/bin/bash": "x",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "tmp").mkdir()
    (root / "usr/share/doc/sh").symlink_to("/usr/share/doc/dash")  # dangling in the rootfs
    rootfs.slim_rootfs(str(root), "bookworm", "http://deb.debian.org/debian", slim=True)
    assert (root / "usr/share/doc/bash/copyright").exists()
    assert not (root / "usr/share/doc/bash/changelog.gz").exists()
    assert not (root / "usr/share/man/man1").exists()
    assert not (root / "usr/share/locale/de").exists()
    assert (root / "usr/share/locale/locale.alias").exists()
    assert not (root / "usr/share/doc/sh").is_symlink()
    assert list((root / "var/lib/apt/lists").iterdir()) == []
    assert list((root / "var/cache/apt").iterdir()) == []
    assert not (root / "etc/apt/sources.list").exists()
    assert "bookworm-security" in (root / "etc/apt/sources.list.d/debian.sources").read_text()
    assert (root / "etc/resolv.conf").read_text() == ""
    assert (root / "etc/hostname").read_text() == ""
    assert not (root / "var/log/bootstrap.log").exists()
    assert (root / "usr/bin/bash").exists()
    assert "path-exclude /usr/share/doc/*" in (root / "etc/dpkg/dpkg.cfg.d/docker").read_text()
    assert (root / "etc/apt/apt.conf.d/docker-clean").exists()
    assert os.access(root / "usr/sbin/policy-rc.d", os.X_OK)


def test_not_slim_keeps_docs(tmp_path):
    root = tmp_path / "rootfs"
    (root / "usr/share/doc/bash").mkdir(parents=True)
    (root / "usr/share/doc/bash/changelog.gz").write_text("x")
    rootfs.slim_rootfs(str(root), "bookworm", "http://deb.debian.org/debian", slim=False)
    assert (root / "usr/share/doc/bash/changelog.gz").exists()
    assert not (root / "etc/dpkg/dpkg.cfg.d/docker").exists()
