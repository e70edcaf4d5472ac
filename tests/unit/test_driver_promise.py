"""The image's driver requirement and the catalogue's promise agree, by machine (issue 62).

For every rendered cell, its effective NVIDIA_REQUIRE_CUDA -- the last ENV that sets it, through
the parent cells, else its nvidia/cuda base's recorded value (trainbase_common.driver_promise) --
is evaluated with the container runtime's own rules (trainbase_common.cuda_requirement) against
the catalogue's row (docs/images.json): the minimum driver it names starts the image on a
data-center GPU, so does each forward-compatibility branch it names, and a driver older than any
it allows is refused. The static conformance check that holds a built image to the same
(test_cuda.py::test_driver_requirement_keeps_the_catalogues_promise) is driven on fake images."""

from __future__ import annotations

import json
import re
from functools import cache
from types import SimpleNamespace

import pytest

from trainbase.render import env_contract
from trainbase_common.cuda_requirement import (
    CONSUMER_BRANDS,
    DATA_CENTER_BRANDS,
    DRIVER_BRANCHES,
    Host,
    admits,
    branch_driver,
    branch_of,
)
from trainbase_common.driver_promise import (
    DriverPromise,
    base_requirement,
    nvidia_require_cuda,
    nvidia_toolkit,
    promise_for,
    unrecorded,
)
from trainbase_conformance.checks import test_cuda

from .conftest import ROOT

ROWS = {r["name"]: r for r in json.loads((ROOT / "docs" / "images.json").read_text())["images"]}
PLACEHOLDER = "<per release>"  # env_contract's value for what a base sets per release


@cache
def _contract() -> env_contract.Contract:
    return env_contract.check(ROOT, cells=sorted(ROWS))


def effective_env(cell: str, contract: env_contract.Contract | None = None) -> dict[str, str]:
    """The environment ``cell``'s image starts containers with, as far as the requirement check
    reads it: the Dockerfiles' ENV (parents included), the base's NVIDIA_REQUIRE_CUDA where none
    sets it."""
    got = (contract or _contract()).final_env(cell)
    assert got is not None, f"{cell}: no Dockerfile environment"
    env, origin = got
    m = re.search(r"base (\S+) (?:contract|lock)", origin)
    assert m, origin
    out = {k: v for k, v in env.items() if v != PLACEHOLDER}
    if env.get("NVIDIA_REQUIRE_CUDA") == PLACEHOLDER:
        out["NVIDIA_REQUIRE_CUDA"] = base_requirement(m.group(1)) or ""
    if env.get("CUDA_VERSION") == PLACEHOLDER:
        out["CUDA_VERSION"] = nvidia_toolkit(m.group(1)) or ""
    return out


def row_promise(row: dict) -> DriverPromise:
    native = row["min_driver"].removeprefix(">= ")
    return DriverPromise(".".join(row["cuda"].split(".")[:2]), native, tuple(row["forward_compat_branches"]))


def _unrecorded(cell: str) -> str | None:
    """The nvidia/cuda toolkit of the cell's base when its requirement is not recorded (a CUDA row
    just added: `build.py check` warns; the static check on the built image evaluates it)."""
    manifest = json.loads((ROOT / "images" / cell / "manifest.json").read_text())["components"]
    found = unrecorded([manifest["os"]["base"]])
    return found[0] if found else None


@pytest.mark.parametrize("cell", sorted(ROWS))
def test_the_requirement_starts_the_image_on_the_drivers_the_catalogue_names(cell):
    if toolkit := _unrecorded(cell):
        pytest.skip(f"nvidia/cuda:{toolkit}'s NVIDIA_REQUIRE_CUDA is not recorded (build.py check names it)")
    row, env = ROWS[cell], effective_env(cell)
    promise = row_promise(row)
    # (a) the catalogue's minimum driver, on a data-center GPU; and each forward-compatibility branch
    for brand in DATA_CENTER_BRANDS:
        verdict = admits(env, Host.of(promise.native, brand, "9.0"))
        assert verdict.starts, f"{cell}: the catalogue's minimum driver {promise.native} is refused: {verdict.message}"
        for b in promise.forward_compat:
            verdict = admits(env, Host.of(branch_driver(b), brand, "9.0"))
            assert verdict.starts, f"{cell}: R{b}, which the catalogue names, is refused: {verdict.message}"
    # (b) a driver older than any the catalogue allows, on a data-center GPU: refused
    oldest = min([branch_of(promise.native), *promise.forward_compat])
    older = max(b for b in DRIVER_BRANCHES if b < oldest)
    for brand in DATA_CENTER_BRANDS:
        assert not admits(env, Host.of(branch_driver(older), brand, "9.0")).starts, (
            f"{cell}: R{older} starts it, older than any driver the catalogue names ({promise.text()})"
        )
    # ...and every other branch, on a data-center and a consumer GPU, as the catalogue says
    assert test_cuda.promise_mismatches(env, promise) == []


@pytest.mark.parametrize("cell", sorted(ROWS))
def test_the_catalogue_row_is_the_promise_of_the_cells_cuda_and_base(cell):
    manifest = json.loads((ROOT / "images" / cell / "manifest.json").read_text())["components"]
    promise = promise_for(manifest["cuda"]["version"], manifest["os"]["base"])
    assert row_promise(ROWS[cell]) == promise
    recorded = manifest["os"]["base"].startswith("nvidia/cuda:") and not _unrecorded(cell)
    assert bool(promise.forward_compat) == recorded


def test_the_promise_in_words():
    ubuntu = promise_for("12.8", "nvidia/cuda:12.8.1-base-ubuntu24.04")
    assert ubuntu.text() == "570.26+, or R470/R535/R550/R560/R565 on data-center GPUs (forward compatibility)"
    assert ubuntu.min_driver == ">= 570.26"
    assert ubuntu.allows("535.183.01", data_center=True) and not ubuntu.allows("535.183.01", data_center=False)
    assert not ubuntu.allows("545.23.08", data_center=True)
    debian = promise_for("13.2", "debian:12.15-slim")
    assert debian.text() == "595.45.04+" and not debian.allows("580.95.05", data_center=True)
    assert promise_for("13.0", "nvidia/cuda:13.0.1-base-ubuntu22.04@sha256:" + "0" * 64).forward_compat == (
        535,
        550,
        565,
        570,
        575,
    )
    with pytest.raises(KeyError):
        base_requirement("nvidia/cuda:12.6.3-base-ubuntu24.04")  # a base whose requirement is not recorded
    assert base_requirement("debian:12.15-slim") is None


# ------------------------------------------------------------- the static conformance check, on fake images
UBUNTU_BASE = "nvidia/cuda:12.8.1-base-ubuntu24.04"
COMPAT_LS = "libcuda.so\nlibcuda.so.1\nlibcuda.so.570.124.06\nlibnvidia-nvvm.so.4\nlibnvidia-ptxjitcompiler.so.1\n"


class Image:
    """A built image as the check reads it: its manifest's CUDA and base, its ENV (docker
    inspect), and what `ls /usr/local/cuda/compat` prints in it."""

    def __init__(self, base: str, env: dict[str, str], compat_ls: str = "", cuda: str = "12.8", foreign=False):
        self.components = {"cuda": {"version": cuda}, "os": {"base": base}}
        self.inspect = {"Config": {"Env": [f"{k}={v}" for k, v in env.items()]}}
        self.compat_ls, self.foreign = compat_ls, foreign

    def sh(self, cmd, timeout=None):
        assert cmd.startswith("ls /usr/local/cuda/compat")
        return SimpleNamespace(rc=0 if self.compat_ls else 2, stdout=self.compat_ls, stderr="")


def ubuntu(env: dict[str, str] | None = None, compat_ls: str = COMPAT_LS) -> Image:
    return Image(UBUNTU_BASE, {"NVIDIA_REQUIRE_CUDA": nvidia_require_cuda("12.8.1"), **(env or {})}, compat_ls)


def debian(env: dict[str, str] | None = None, compat_ls: str = "") -> Image:
    return Image("debian:12.15-slim", {"NVIDIA_REQUIRE_CUDA": "cuda>=12.8", **(env or {})}, compat_ls)


check = test_cuda.test_driver_requirement_keeps_the_catalogues_promise


def test_the_check_passes_the_ubuntu_and_debian_images_as_rendered():
    check(ubuntu())
    check(debian())


def test_the_check_fails_an_ubuntu_image_whose_requirement_dropped_the_bases_alternatives():
    """What every Ubuntu image did before issue 62: cuda>=12.8 over the base's value."""
    with pytest.raises(AssertionError, match=r"disagrees with the catalogue's '570\.26\+, or R470/R535") as e:
        check(ubuntu({"NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}))
    assert "driver 535.54.03 on a Tesla GPU: the catalogue promises it, the runtime is refused" in str(e.value)


def test_the_check_fails_a_debian_image_that_promises_what_the_runtime_refuses_or_admits_more():
    with pytest.raises(
        AssertionError, match=r"driver 570\.26 on a Tesla GPU: the catalogue promises it, the runtime is refused"
    ):
        check(debian({"NVIDIA_REQUIRE_CUDA": "cuda>=12.9"}))
    with pytest.raises(
        AssertionError, match=r"driver 550\.54\.14 on a Tesla GPU: the catalogue excludes it, the runtime starts"
    ):
        check(debian({"NVIDIA_DISABLE_REQUIRE": "true"}))


def test_the_check_fails_an_image_that_promises_forward_compatibility_without_the_libraries():
    with pytest.raises(AssertionError, match=r"but the image has no libcuda in /usr/local/cuda/compat"):
        check(ubuntu(compat_ls=""))


def test_the_check_fails_compat_libraries_of_a_branch_too_old_for_the_promise():
    with pytest.raises(AssertionError, match=r"libcuda\.so\.565\.57\.01 is of branch R565: it cannot serve R565"):
        check(ubuntu(compat_ls="libcuda.so.1\nlibcuda.so.565.57.01\n"))


def test_the_check_fails_compat_libraries_the_catalogue_does_not_name():
    with pytest.raises(AssertionError, match=r"holds libcuda\.so\.570\.124\.06, but the catalogue names no forward"):
        check(debian(compat_ls=COMPAT_LS))


def test_the_check_skips_an_image_trainbase_did_not_build():
    with pytest.raises(pytest.skip.Exception, match="makes no promise"):
        check(Image("ubuntu:22.04", {}, foreign=True))


def test_every_branch_and_brand_is_swept():
    """The check's sweep covers every branch NVIDIA released and both kinds of GPU."""
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}
    wrong = test_cuda.promise_mismatches(env, promise_for("12.8", UBUNTU_BASE))
    swept = {(w.split()[1], w.split()[4]) for w in wrong}
    assert {b for _, b in swept} == set(DATA_CENTER_BRANDS)  # consumer GPUs: refused, as promised
    assert {d for d, _ in swept} == {branch_driver(b) for b in (470, 535, 550, 560, 565)}
    assert len(DRIVER_BRANCHES) * len(DATA_CENTER_BRANDS + CONSUMER_BRANDS) == 88


def test_a_cuda_row_whose_base_is_not_recorded_promises_its_native_driver_only(workdir, capsys):
    """Adding CUDA 12.6 as docs/matrix.md says once ended the render in `KeyError: '12.6.3'`
    (issue 65's walk): a toolkit whose branches are not recorded promises the native driver
    (never one the image refuses) and `check` names it with where to record them."""
    from .conftest import run_cli

    p = promise_for("12.6", "nvidia/cuda:12.6.3-base-ubuntu24.04")
    assert p.forward_compat == () and p.native and p.text() == f"{p.native}+"
    assert unrecorded(["nvidia/cuda:12.6.3-base-ubuntu24.04", "nvidia/cuda:12.8.1-base-ubuntu24.04", "debian:12"]) == [
        "12.6.3"
    ]
    path = workdir / "matrix.yaml"
    text = path.read_text()
    path.write_text(text.replace("toolkit: 12.8.1", "toolkit: 12.8.0", 1))
    run_cli(["render", "--file", str(path)], capsys)
    code, out, err = run_cli(["check", "--file", str(path)], capsys)
    assert "warning: nvidia/cuda:12.8.0: the driver branches" in err and "NVIDIA_CUDA_BASES" in err, err


def test_a_base_locks_recorded_requirement_decides_over_the_table(tmp_path):
    """Where locks/bases.json recorded the base's image config Env (its NVIDIA_REQUIRE_CUDA, as the
    registry serves it), that value is the one evaluated: a base whose publisher dropped R535 from
    13.2.1's forward compatibility promises no R535, whatever NVIDIA_CUDA_BASES says of 13.2.1."""
    from trainbase.define import base_lock
    from trainbase.render import catalogue

    base = "nvidia/cuda:13.2.1-base-ubuntu24.04"
    dropped = nvidia_require_cuda("13.2.1").replace("driver>=535,driver<536", "driver>=999,driver<1000")
    env = ["PATH=/usr/local/cuda/bin:/usr/bin", f"NVIDIA_REQUIRE_CUDA={dropped}"]
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "bases.json").write_text(
        json.dumps(
            {"schema": 1, "bases": {base: {"how": base_lock.REGISTRY, "identity": "sha256:" + "1" * 64, "env": env}}}
        )
    )
    manifest = {"components": {"cuda": {"version": "13.2.1"}, "os": {"base": f"{base}@sha256:{'1' * 64}"}}}
    assert catalogue.promise_of(manifest).forward_compat == (535, 570, 580, 590)  # the table
    locked = catalogue.promise_of(manifest, base_lock.load(tmp_path))
    assert locked.forward_compat == (570, 580, 590, 999) and not locked.allows("535.274.02", data_center=True)
