"""Distro package names by release (matrix.yaml's distro_packages, issue 71): every package a
rendered recipe installs with apt or reads with dpkg is the table's name for that cell's OS.

Ubuntu 24.04 and Debian 13 went through the 2024 64-bit time_t transition (libpmix2 became
libpmix2t64, librdmacm1 librdmacm1t64). Intel MPI's block installed `libpmix2` and then ran
`dpkg -L libpmix2`: apt installs the renamed package in its place, dpkg knows no libpmix2, and
every Intel MPI cell of Ubuntu 24.04 stopped at that RUN. The table gives each release its
names; a recipe naming another release's name is refused here, before any build."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from trainbase.define.matrix import load
from trainbase.errors import TrainbaseError

from .conftest import ROOT

# `apt-get install -y --no-install-recommends NAME[=VERSION] ...` up to the next `&&`, `;` or the
# RUN's end (continuation lines joined first); `dpkg -L NAME`, `dpkg -s NAME`
_INSTALL = re.compile(r"apt-get install -y --no-install-recommends ([^&;|\n]*)")
_DPKG = re.compile(r"dpkg(?:-query)? -[Ls] ([a-z0-9][a-z0-9.+-]+)")


def packages_named(dockerfile: str) -> set[str]:
    """Every distro package a Dockerfile installs or asks dpkg about, without version pins."""
    text = re.sub(r"\\\n", " ", dockerfile)
    names: set[str] = set()
    for m in _INSTALL.finditer(text):
        names |= {tok.split("=", 1)[0] for tok in m.group(1).split() if not tok.startswith("-")}
    names |= set(_DPKG.findall(text))
    return names


def _recipes() -> list[tuple[str, str, str]]:
    out = []
    for d in sorted((ROOT / "images").iterdir()):
        manifest = json.loads((d / "manifest.json").read_text())
        out.append((d.name, manifest["axes"]["os"], (d / "Dockerfile").read_text()))
    return out


@pytest.fixture(scope="module")
def matrix():
    return load(ROOT / "matrix.yaml")


def test_every_package_a_recipe_names_is_its_releases_name(matrix):
    spec = matrix.spec
    wrong = []
    for name, os_key, text in _recipes():
        valid = {spec.package_name(what, os_key): what for what in spec.distro_packages}
        for pkg in sorted(packages_named(text)):
            if pkg in valid:
                continue
            other = [
                f"{what} is {spec.package_name(what, os_key)} on {os_key}"
                for what in spec.distro_packages
                if any(spec.package_name(what, o) == pkg for o in spec.os)
            ]
            wrong.append(f"{name}: {pkg} ({'; '.join(other) or 'not in distro_packages'})")
    assert not wrong, "\n".join(wrong[:20])


def test_the_check_refuses_a_name_of_another_release(matrix):
    """What the check above says about 591e86f's Intel MPI block on Ubuntu 24.04."""
    text = (ROOT / "images" / "intelmpi2021.18-cuda13.2-cudnn9-ubuntu24.04" / "Dockerfile").read_text()
    assert "libpmix2t64" in packages_named(text) and "libpmix2" not in packages_named(text)
    old = text.replace("libpmix2t64", "libpmix2")  # the block as it was
    spec = matrix.spec
    valid = {spec.package_name(what, "ubuntu24.04") for what in spec.distro_packages}
    assert packages_named(old) - valid == {"libpmix2"}


def test_the_parser_reads_multi_line_installs_and_pins():
    text = (
        "RUN apt-get update \\\n && apt-get install -y --no-install-recommends \\\n"
        "      doca-ofed-userspace=3.2.3-019000 \\\n      ibverbs-utils perftest \\\n"
        ' && pmix="$(dpkg -L libpmix2t64 | grep x)"\n'
    )
    assert packages_named(text) == {"doca-ofed-userspace", "ibverbs-utils", "perftest", "libpmix2t64"}


def test_debian_13_and_ubuntu_24_04_share_their_names(matrix):
    """The names the Ubuntu 24.04 rows use are the ones the Debian 13 builds here install with a
    real apt, wherever the two releases agree; the table must say where they do not."""
    spec = matrix.spec
    differ = {
        w for w in spec.distro_packages if spec.package_name(w, "debian13") != spec.package_name(w, "ubuntu24.04")
    }
    assert not differ, f"the table gives Debian 13 and Ubuntu 24.04 different names for {sorted(differ)}"
    ubuntu = set().union(*(packages_named(t) for _, o, t in _recipes() if o == "ubuntu24.04"))
    debian = set().union(*(packages_named(t) for _, o, t in _recipes() if o == "debian13"))
    shared = ubuntu & debian
    # the time_t-renamed runtime packages are among what a Debian 13 build really installs
    assert {"libpmix2t64", "librdmacm1t64"} <= shared, sorted(shared)
    # what only Ubuntu 24.04 installs: DOCA's own packages (its repository) and what only cells
    # the Debian 13 row does not have use (gnupg: the DOCA key's import; cmake: Horovod's build).
    # Those are checked by rendering only; trixie's index has both names too.
    doca_only = {spec.package_name(w, "ubuntu24.04") for w in spec.distro_packages if w.startswith("doca-")}
    # The fabric stack's toolchain (autoconf, automake, libtool, hwloc) is built only beside a
    # source-built MPI, which the Debian 13 row's PyPI MPIs are not; the Debian 12 builds install
    # it with a real apt, under the names the table gives all three releases alike.
    debian12 = set().union(*(packages_named(t) for _, o, t in _recipes() if o == "debian12"))
    same_everywhere = {
        spec.package_name(w, "ubuntu24.04")
        for w in spec.distro_packages
        if spec.package_name(w, "ubuntu24.04") == spec.package_name(w, "debian12") == spec.package_name(w, "debian13")
    }
    built_on_debian12 = debian12 & same_everywhere
    assert ubuntu - debian <= doca_only | {"gnupg", "cmake"} | built_on_debian12, sorted(ubuntu - debian)
    assert {"autoconf", "libhwloc-dev"} <= (ubuntu - debian) & built_on_debian12


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"libpmix2": ["debian12"]}, "no name for os row"),
        (
            {"libpmix2": ["debian12", "ubuntu22.04", "debian13"], "libpmix2t64": ["debian13", "ubuntu24.04"]},
            "has two names",
        ),
        (
            {"libpmix2": ["debian12", "ubuntu22.04", "debian11"], "libpmix2t64": ["debian13", "ubuntu24.04"]},
            "which os has not",
        ),
    ],
)
def test_the_table_gives_every_row_exactly_one_name(workdir, entry, message):
    path = workdir / "matrix.yaml"
    data = yaml.safe_load(path.read_text())
    data["distro_packages"]["pmix-runtime"] = entry
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(TrainbaseError, match=message):
        load(path)


def test_a_block_naming_a_package_the_table_has_not_fails_the_render(workdir):
    from trainbase.render import recipes

    block = workdir / "templates" / "blocks" / "horovod.j2"
    block.write_text(block.read_text().replace('apt("cmake")', 'apt("cmake-gui")'))
    m = load(workdir / "matrix.yaml")
    cell = next(c for c in m.included if c.framework == "horovod")
    with pytest.raises(TrainbaseError, match="distro_packages has no entry cmake-gui"):
        recipes.render_all(m, [cell], root=workdir)


def test_every_os_row_declares_its_support_dates(matrix):
    for key, row in matrix.spec.os.items():
        assert row.support is not None, f"os.{key} has no support dates (the catalogue prints them)"
        assert row.support.regular < (row.support.extended or "9999"), key


def test_an_open_mpi_on_the_distros_libraries_compiles_and_loads_them(matrix):
    """mpi system_libs (Open MPI 4.1.4 as Debian builds it): configure is told to use the distro's
    hwloc, libevent and PMIx, the compile stage installs their -dev packages and the image their
    runtime packages, under the names the table gives the cell's release."""
    text = (ROOT / "images" / "openmpi4.1.4-cuda12.8-cudnn9-debian12" / "Dockerfile").read_text()
    for flag in (
        "--with-hwloc=external",
        "--with-libevent=external",
        '--with-pmix="/usr/lib/$(gcc -print-multiarch)/pmix2"',
    ):
        assert flag in text, flag
    names = packages_named(text)
    assert {"libhwloc-dev", "libevent-dev", "libpmix-dev"} <= names
    assert {"libhwloc15", "libevent-core-2.1-7", "libevent-pthreads-2.1-7", "libpmix2"} <= names


def test_system_libs_is_refused_where_no_open_mpi_is_compiled(workdir):
    path = workdir / "matrix.yaml"
    data = yaml.safe_load(path.read_text())
    data["mpi"]["openmpi5.0.11"]["system_libs"] = ["pmix"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(TrainbaseError, match="system_libs is for an Open MPI built from source"):
        load(path)
