"""The suite must be able to fail: each folder of broken/ is a small image built FROM a real
one with one thing broken; the conformance checks it names must FAIL on it (and pass on the
real image, the control). Collected only when named, or with --broken-variants:

    pytest tests/conformance/test_broken_variants.py --image trainbase/openmpi4.1.4-cuda12.8-cudnn9-debian12:latest

The checks are the packaged suite's (trainbase_conformance/checks, named in expect.json by file);
the broken images and this self-test stay in the repository. A check must fail for the reason the
variant plants, not just fail: expect.json gives each one the pattern its failure message must
match, and an error (a crash of the check's own setup) fails the self-test (verdict.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conformance import verdict
from trainbase.build import docker_build
from trainbase_common import engine
from trainbase_conformance.containers import Container, short_name
from trainbase_conformance.options import image_refs
from trainbase_conformance.resources import CHECKS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VARIANTS = sorted(p.name for p in (HERE / "broken").iterdir() if (p / "Dockerfile").exists())


def _expect(variant: str) -> dict:
    return json.loads((HERE / "broken" / variant / "expect.json").read_text())


def run_suite(image: str, paths: list[str], k: str, workdir: Path) -> tuple[int, list[verdict.Case], Path, str]:
    """Run the conformance suite on ``image`` in a subprocess: exit code, every test case with
    its state and message, the JUnit file (for `python -m tests.conformance.verdict`), and the
    output's tail."""
    junit = workdir / "junit.xml"
    args = [
        sys.executable,
        "-m",
        "pytest",
        *[str(CHECKS / p) for p in paths],
        "--image",
        image,
        "-k",
        k,
        "-p",
        "no:cacheprovider",
        "-q",
        "--junitxml",
        str(junit),
        "--conformance-report",
        str(workdir / "conformance.md"),
    ]
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=1200, check=False)
    cases = verdict.cases_from_junit(junit.read_bytes()) if junit.exists() else []
    return p.returncode, cases, junit, (p.stdout[-3000:] + p.stderr[-2000:])


def _labels(image: str) -> dict[str, str]:
    info = engine.inspect_image(image)
    return ((info.raw.get("Config") or {}).get("Labels") or {}) if info else {}


def mpi_kind(image: str) -> str:
    """The image's MPI kind from its `io.trainbase.mpi` label (`intelmpi-2021.18.1` -> intelmpi)."""
    return _labels(image).get("io.trainbase.mpi", "").split("-", 1)[0]


def frameworks(image: str) -> set[str]:
    """The frameworks the image carries, from its `io.trainbase.framework.<name>` labels."""
    return {
        k.removeprefix("io.trainbase.framework.") for k in _labels(image) if k.startswith("io.trainbase.framework.")
    }


def fits(expect: dict, kind: str, fws: set[str]) -> bool:
    """Whether an image of this MPI kind and these frameworks can be a variant's base."""
    return (not expect.get("mpi") or kind == expect["mpi"]) and (
        not expect.get("framework") or expect["framework"] in fws
    )


def plan(refs: list[str]) -> dict[str, str | None]:
    """variant -> the image it is built FROM: the first image for a variant of any image, the
    first image of its MPI kind / with its framework for a variant that names one (None: no
    such image given)."""
    facts = {r: (mpi_kind(r), frameworks(r)) for r in refs}
    return {v: next((r for r in refs if fits(_expect(v), *facts[r])), None) for v in VARIANTS}


def _needs(v: str) -> str:
    e = _expect(v)
    return " and ".join(
        x for x in (e.get("mpi") and f"{e['mpi']} images", e.get("framework") and f"a {e['framework']} image") if x
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "base" in metafunc.fixturenames:
        refs = image_refs(metafunc.config)
        if not refs:
            metafunc.parametrize(
                ("base", "variant"),
                [
                    pytest.param(None, v, marks=pytest.mark.skip(reason="no base image: pass --image REF"))
                    for v in VARIANTS
                ],
                ids=[f"no-image-{v}" for v in VARIANTS],
                scope="session",
            )
            return
        # the variants of one base next to each other: pytest keeps this order, and the session
        # fixture `control` (the base's own run) is made again whenever the base changes
        bases = dict(sorted(plan(refs).items(), key=lambda vb: (vb[1] is None, refs.index(vb[1]) if vb[1] else 0)))
        params = [
            pytest.param(b, v)
            if b
            else pytest.param(
                None, v, marks=pytest.mark.skip(reason=f"{v} needs {_needs(v)} and none was given (--image/--report)")
            )
            for v, b in bases.items()
        ]
        metafunc.parametrize(("base", "variant"), params, ids=list(bases), scope="session")


def control_from_junit(junit: bytes, base: str) -> dict[str, str]:
    """The main conformance run's verdict on ``base`` (its JUnit): check -> the worst state over
    the check's parametrizations on that image (none of the other images' cases)."""
    image = re.compile(r"(?:^|[\[-])" + re.escape(short_name(base)) + r"(?:$|[\]-])")
    modules = {p.stem for p in CHECKS.glob("test_*.py")}
    mine = [
        c
        for c in verdict.cases_from_junit(junit)
        if c.module in modules and "[" in c.name and image.search(c.name.split("[", 1)[1])
    ]
    return verdict.worst_states(mine)


@pytest.fixture(scope="session")
def control(base, request, tmp_path_factory) -> dict[str, str]:
    """Every selection of the variants built FROM ``base``, run once against that real image:
    the checks must pass there, or their failure on a variant would prove nothing. Where the
    main conformance run already judged this very image (--control-junit, its JUnit: .ci/run
    runs it first), its verdict is the control, if it ran every check the variants claim (a
    framework image's deselected tiers did not run there: then the control runs here)."""

    mine = [v for v, b in plan(image_refs(request.config)).items() if b == base]
    junit = request.config.getoption("--control-junit")
    if junit:
        states = control_from_junit(Path(junit).read_bytes(), base)
        missing = sorted({check for v in mine for check in verdict.expectations(_expect(v))} - states.keys())
        if not missing:
            return states
        print(f"\nthe main run ({junit}) did not run {', '.join(missing)} on {base}: the control runs here")
    paths = sorted({p for v in mine for p in _expect(v)["paths"]})
    k = " or ".join(f"({_expect(v)['k']})" for v in mine)
    rc, cases, _, tail = run_suite(base, paths, k, tmp_path_factory.mktemp("control"))
    assert cases, f"the control run on {base} ran nothing (rc {rc}):\n{tail}"
    return verdict.worst_states(cases)


@pytest.mark.engine
@pytest.mark.slow
def test_broken_variant_fails(base, variant, control, tmp_path):
    expect = _expect(variant)
    expected = verdict.expectations(expect)
    not_green = {t: control.get(t, "not run") for t in expected if control.get(t) != "passed"}
    assert not not_green, (
        f"on the real image {base} these checks do not pass, so their failure on "
        f"{variant} would prove nothing: {not_green}"
    )
    tag = f"trainbase-broken/{short_name(base).split(':')[0]}:{variant}-{uuid.uuid4().hex[:6]}"
    context = HERE / "broken" / variant
    if expect.get("pypi") or expect.get("repo_files"):
        context = tmp_path / "context"
        shutil.copytree(HERE / "broken" / variant, context)
        # files of the repository the variant builds with (a patch the block applies), by name,
        # so the variant uses the very file the image was built with
        for f in expect.get("repo_files", []):
            shutil.copy(ROOT / f, context / Path(f).name)
    if expect.get("pypi"):
        # a variant that downloads from PyPI gets the host's CA bundle as the builds do, in its
        # context as ca-bundle.crt; its Dockerfile uses it in a fetch stage only
        ca = docker_build.ca_bundle("auto")
        if ca:
            shutil.copy(ca, context / "ca-bundle.crt")
        else:
            (context / "ca-bundle.crt").write_text("")
    try:
        # a variant that fetches from Debian's mirror needs the build network the builds use
        engine.build_legacy(context, tag, {"BASE": base}, network=os.environ.get("TRAINBASE_BUILD_NETWORK") or None)
    except engine.EngineError as e:
        pytest.fail(f"building {variant} FROM {base} failed: {e}")
    try:
        if expect.get("absent_in_final_fs"):
            probe = Container.start(tag, engine.RunOptions(), prefix="tbconf-variant")
            try:
                for path in expect["absent_in_final_fs"]:
                    r = probe.exec(f"test -e {path}", timeout=30)
                    assert r.returncode == 1, (
                        f"{path} is in {variant}'s final filesystem; the variant is meant "
                        "to hide it in a lower layer only"
                    )
            finally:
                probe.remove()
        rc, cases, junit, tail = run_suite(tag, expect["paths"], expect["k"], tmp_path)
        problems = verdict.judge(expected, cases)
        assert not problems, (
            f"{variant} ({expect['why']}) does not prove what its expect.json says:\n- "
            + "\n- ".join(problems)
            + f"\nevery case: .venv/bin/python -m tests.conformance.verdict "
            f"{junit} --variant {variant}\n{tail}"
        )
        assert rc == 1, f"the suite exited {rc} on {variant} (1 = some check failed):\n{tail}"
        print(
            f"\n{variant} FROM {base}: failed as expected, each for its reason:\n  "
            + "\n  ".join(f"{c.name}: {verdict.one_line(c.message, 300)}" for c in cases if c.state == "failed")
        )
    finally:
        engine.remove_image(tag, force=True)
