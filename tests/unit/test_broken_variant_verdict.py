"""The self-test's verdict (tests/conformance/verdict.py), tested without Docker: a broken variant
proves its checks only when each FAILED, for the reason its expect.json's pattern describes.
A check that fails for another reason, errors, skips or passes is refused. Every expect.json
is read the way the self-test reads it, and names checks that exist in the files it runs."""

import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest

from tests.conformance import verdict
from trainbase_conformance.resources import CHECKS

from .conftest import ROOT

BROKEN = ROOT / "tests" / "conformance" / "broken"
VARIANTS = sorted(p.name for p in BROKEN.iterdir() if (p / "Dockerfile").exists())

# the stray-nccl-net-plugin variant's claim, and the messages the check's assertions write
STRAY = {
    "test_nccl_plugins_declared_and_load": {
        "message": r"NCCL plugins in the image that the manifest does not declare: "
        r"\[[^\]]*'/usr/local/lib/libnccl-net\.so'",
        "why": "the undeclared-plugin half",
    }
}
RIGHT = (
    "AssertionError: NCCL plugins in the image that the manifest does not declare: "
    "['/usr/local/lib/libnccl-net.so']\nassert not ['/usr/local/lib/libnccl-net.so']"
)
WRONG = (
    "AssertionError: NCCL plugins that do not load or export no plugin symbol: {'/usr/local/lib/libnccl-net.so': "
    "{'load': 'error: libsharp_coll.so.5: cannot open shared object file', 'symbols': []}}"
)


def junit(*cases: tuple[str, str, str]) -> str:
    """A pytest JUnit document: (name, state, message) per test case."""
    body = ""
    for name, state, message in cases:
        tag = {"failed": "failure", "error": "error", "skipped": "skipped"}.get(state)
        child = f"<{tag} message={quoteattr(message)}>details</{tag}>" if tag else ""
        body += f'<testcase classname="test_nccl" name={quoteattr(name)} time="0.1">{child}</testcase>'
    return f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">{body}</testsuite></testsuites>'


CASE = "test_nccl_plugins_declared_and_load[trainbase-broken/x:stray-nccl-net-plugin-1a2b3c]"


@pytest.mark.parametrize(
    "state, message, refused",
    [
        ("failed", WRONG, "failed for another reason than the variant's defect"),
        ("error", 'failed on setup with "RuntimeError: docker run exited 125"', "ERRORED instead of failing"),
        ("skipped", "n/a: the manifest claims no NCCL", "did not fail"),
        ("passed", "", "did not fail"),
        ("failed", RIGHT, None),
    ],
    ids=["failed-for-the-wrong-reason", "errored", "skipped", "passed", "failed-for-the-right-reason"],
)
def test_only_a_failure_for_the_right_reason_is_accepted(state, message, refused):
    problems = verdict.judge(
        verdict.expectations({"must_fail": STRAY}), verdict.cases_from_junit(junit((CASE, state, message)))
    )
    if refused is None:
        assert problems == []
    else:
        assert len(problems) == 1 and refused in problems[0], problems


def test_a_wrong_reason_is_shown_with_its_message_and_pattern():
    [problem] = verdict.judge(
        verdict.expectations({"must_fail": STRAY}), verdict.cases_from_junit(junit((CASE, "failed", WRONG)))
    )
    assert "message: AssertionError: NCCL plugins that do not load" in problem
    assert f"pattern: {STRAY['test_nccl_plugins_declared_and_load']['message']}" in problem
    assert "(the undeclared-plugin half)" in problem


def test_parametrizations_one_right_failure_suffices_but_no_error_and_no_wrong_failure():
    exp = verdict.expectations({"must_fail": STRAY})
    name = "test_nccl_plugins_declared_and_load[{}]"
    assert (
        verdict.judge(
            exp, verdict.cases_from_junit(junit((name.format("a"), "passed", ""), (name.format("b"), "failed", RIGHT)))
        )
        == []
    )
    assert verdict.judge(
        exp, verdict.cases_from_junit(junit((name.format("a"), "failed", WRONG), (name.format("b"), "failed", RIGHT)))
    )
    assert verdict.judge(
        exp,
        verdict.cases_from_junit(
            junit((name.format("a"), "error", "failed on setup"), (name.format("b"), "failed", RIGHT))
        ),
    )
    # an error in a check the variant does not name still means the run judged nothing there
    assert verdict.judge(exp, verdict.cases_from_junit(junit(("test_other", "error", "boom"), (CASE, "failed", RIGHT))))
    assert "did not run" in verdict.judge(exp, verdict.cases_from_junit(junit(("test_other", "failed", RIGHT))))[0]


def test_expectations_refuse_the_old_list_and_a_bad_pattern():
    with pytest.raises(ValueError, match="must map each check"):
        verdict.expectations({"must_fail": ["test_x"]})
    with pytest.raises(ValueError, match="test_x: the pattern does not compile"):
        verdict.expectations({"must_fail": {"test_x": {"message": "(", "why": "w"}}})
    assert verdict.expectations({"must_fail": {"test_x": "boom"}})["test_x"].pattern == "boom"


def test_pytest_writes_the_messages_the_patterns_are_written_for(tmp_path):
    """The patterns are written against pytest's own JUnit: an assertion's message after
    `AssertionError: `, pytest.fail's after `Failed: `, a fixture crash as an <error>."""
    (tmp_path / "test_fake.py").write_text(
        textwrap.dedent("""
        import pytest

        @pytest.fixture
        def broken():
            raise RuntimeError("the container did not start")

        def test_assertion():
            found = ["/usr/local/lib/libnccl-net.so"]
            assert not found, f"NCCL plugins in the image that the manifest does not declare: {found}"

        def test_fail():
            pytest.fail("40 MiB crossed the container's loopback device")

        def test_crash(broken):
            pass

        def test_skip():
            pytest.skip("n/a: no such thing")

        def test_pass():
            pass
    """)
    )
    xml = tmp_path / "junit.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", str(xml), "test_fake.py"],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
        check=False,
    )
    cases = {c.check: c for c in verdict.cases_from_junit(xml.read_bytes())}
    assert {k: c.state for k, c in cases.items()} == {
        "test_assertion": "failed",
        "test_fail": "failed",
        "test_crash": "error",
        "test_skip": "skipped",
        "test_pass": "passed",
    }
    assert verdict.expectations({"must_fail": STRAY})["test_nccl_plugins_declared_and_load"].matches(
        cases["test_assertion"].message
    )
    assert cases["test_assertion"].message.startswith("AssertionError: NCCL plugins in the image")
    assert cases["test_fail"].message.startswith("Failed: 40 MiB crossed")
    assert "the container did not start" in cases["test_crash"].message
    assert cases["test_skip"].message == "n/a: no such thing"


def test_the_command_prints_every_case_and_the_verdict(tmp_path, capsys):
    xml = tmp_path / "junit.xml"
    xml.write_text(junit((CASE, "failed", WRONG), ("test_other[x]", "passed", "")))
    assert verdict.main([str(xml), "--variant", "stray-nccl-net-plugin"]) == 1
    out = capsys.readouterr().out
    assert f"failed   {CASE}" in out and "passed   test_other[x]" in out and "plugin symbol" in out
    assert "stray-nccl-net-plugin: does NOT prove its checks" in out and "failed for another reason" in out
    assert verdict.main([str(xml)]) == 0


def _functions(path: str) -> set[str]:
    return {n.name for n in ast.parse((CHECKS / path).read_text()).body if isinstance(n, ast.FunctionDef)}


def _marked_gpu(path: str, check: str) -> bool:
    """Whether CHECKS/PATH's function CHECK carries @pytest.mark.gpu."""
    [fn] = [
        n for n in ast.parse((CHECKS / path).read_text()).body if isinstance(n, ast.FunctionDef) and n.name == check
    ]
    return any(ast.unparse(d) == "pytest.mark.gpu" for d in fn.decorator_list)


def test_a_gpu_claim_is_judged_by_its_own_key():
    """gpu_must_fail is read apart from must_fail: the self-test on an engine without a GPU never
    judges it, and `verdict --gpu` judges only it."""
    expect = {
        "must_fail": {"test_a": {"message": "A", "why": "x" * 30}},
        verdict.GPU_CLAIMS: {"test_g": {"message": "G", "why": "y" * 30}},
    }
    assert list(verdict.expectations(expect)) == ["test_a"]
    assert list(verdict.expectations(expect, verdict.GPU_CLAIMS)) == ["test_g"]
    with pytest.raises(ValueError, match="gpu_must_fail must map"):
        verdict.expectations({"must_fail": expect["must_fail"]}, verdict.GPU_CLAIMS)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_names_real_checks_with_a_pattern_and_a_why(variant):
    expect = json.loads((BROKEN / variant / "expect.json").read_text())
    expected = verdict.expectations(expect)
    defined = set().union(*(_functions(p) for p in expect["paths"]))
    for check, e in expected.items():
        assert check in defined, f"{variant}: {check} is in none of {expect['paths']}"
        assert re.search(rf"\b{check}\b", expect["k"]), f"{variant}: k {expect['k']!r} does not select {check}"
        assert len(e.why) > 20, f"{variant}: {check}: say which assertion the pattern is for"
    assert not set(expect) - {
        "why",
        "mpi",
        "framework",
        "pypi",
        "repo_files",
        "paths",
        "k",
        "must_fail",
        "absent_in_final_fs",
        "note",
        "gpu_paths",
        verdict.GPU_CLAIMS,
    }
    # the GPU runner's claims: checks of the gpu tier (what scripts/gpu-variants.sh runs there)
    gpu_defined = {f: _functions(f) for f in expect.get("gpu_paths", [])}
    for check, e in (verdict.expectations(expect, verdict.GPU_CLAIMS) if verdict.GPU_CLAIMS in expect else {}).items():
        [f] = [f for f, fns in gpu_defined.items() if check in fns] or [None]
        assert f, f"{variant}: {check} is in none of its gpu_paths {list(gpu_defined)}"
        assert _marked_gpu(f, check), (
            f"{variant}: {check} is not a check of the gpu tier (gpu_must_fail is judged there)"
        )
        assert len(e.why) > 20, f"{variant}: {check}: say which assertion the pattern is for"
    assert expect.get("framework") in (None, "pytorch", "tensorflow", "horovod", "deepspeed")
    dockerfile = (BROKEN / variant / "Dockerfile").read_text()
    assert re.match(r"ARG BASE\nFROM \$\{BASE\}( AS \w+)?\n", dockerfile), f"{variant}: built FROM the image under test"
    stages = re.findall(r"^FROM (.*)$", dockerfile, re.M)
    assert stages[-1] == "${BASE}", f"{variant}: its final stage is the image under test"
    assert ("ca-bundle.crt" in dockerfile) == bool(expect.get("pypi")), (
        f"{variant}: the CA is staged only for a pypi variant"
    )
    for f in expect.get("repo_files", []):  # copied into the context by name; the Dockerfile must use it
        assert (ROOT / f).is_file(), f"{variant}: repo_files names {f}, which is not in the repository"
        assert re.search(rf"^COPY {re.escape(Path(f).name)} ", dockerfile, re.M), (
            f"{variant}: {f} is staged but never COPYed"
        )


@pytest.mark.parametrize(
    "expect, kind, fws, fits",
    [
        ({}, "openmpi", set(), True),  # any image
        ({"mpi": "intelmpi"}, "openmpi", {"pytorch"}, False),
        ({"mpi": "intelmpi"}, "intelmpi", set(), True),
        ({"framework": "horovod"}, "openmpi", {"pytorch"}, False),  # a PyTorch image is no Horovod one
        ({"framework": "horovod"}, "openmpi", {"pytorch", "horovod"}, True),
        ({"framework": "deepspeed", "mpi": "intelmpi"}, "openmpi", {"pytorch", "deepspeed"}, False),
    ],
)
def test_a_variant_is_built_only_from_an_image_of_its_mpi_and_framework(expect, kind, fws, fits):
    from tests.conformance.test_broken_variants import fits as fits_

    assert fits_(expect, kind, fws) is fits


def test_the_control_from_the_main_run_is_that_images_own_cases_only():
    """--control-junit: a check's control state is its worst over its cases on the base image,
    not on a framework image whose name holds the base's, nor a case of the repository's tests."""
    from tests.conformance.test_broken_variants import control_from_junit

    base = "trainbase/openmpi4.1.4-cuda12.8-cudnn9-debian12:rbc5c25e13ba0"
    framework = "pytorch2.10.0-openmpi4.1.4-cuda12.8-cudnn9-debian12:r90dd0408c7af"
    doc = junit(
        ("test_nccl_loads[openmpi4.1.4-cuda12.8-cudnn9-debian12:rbc5c25e13ba0]", "passed", ""),
        (f"test_nccl_loads[{framework}]", "failed", "no NCCL"),
        ("test_nccl_loads[openmpi4.1.4-cuda12.8-cudnn9-debian12:rbc5c25e13ba01]", "failed", "another tag"),
        ("test_nccl_version[openmpi4.1.4-cuda12.8-cudnn9-debian12:rbc5c25e13ba0-login]", "passed", ""),
        ("test_nccl_version[openmpi4.1.4-cuda12.8-cudnn9-debian12:rbc5c25e13ba0-non-login]", "failed", "x"),
        ("test_nccl_skip[openmpi4.1.4-cuda12.8-cudnn9-debian12:rbc5c25e13ba01]", "failed", "another tag"),
    )
    doc = doc.replace(
        '<testcase classname="test_nccl" name="test_nccl_skip',
        '<testcase classname="tests.build.test_build" name="test_nccl_skip',
    )
    assert control_from_junit(doc.encode(), base) == {"test_nccl_loads": "passed", "test_nccl_version": "failed"}


def test_a_variant_that_rebuilds_a_framework_uses_the_sdist_and_patch_the_matrix_pins():
    """The rebuild variants pin their sdist in their Dockerfile (a variant's context is its own
    folder): they must be the very artifacts the images are built from, so a version bump fails
    here, naming the variant to move with it, instead of a variant testing an older release."""
    import glob

    from trainbase.define.matrix import load

    m = load(ROOT / "matrix.yaml")
    hvd = m.spec.artifacts["horovod-0.28.1-sdist"]
    text = (BROKEN / "horovod-without-gpu-operations" / "Dockerfile").read_text()
    assert "horovod-0.28.1.tar.gz" in hvd.url and f"--hash=sha256:{hvd.sha256}" in text, (
        "horovod-without-gpu-operations: its sdist is not matrix.yaml's horovod-0.28.1-sdist"
    )
    patch = json.loads((BROKEN / "horovod-without-gpu-operations" / "expect.json").read_text())["repo_files"]
    assert "patches/horovod-0.28.1-cxx-standards.patch" in patch
    assert "patches/horovod-0.28.1-cxx-standards.patch" in (ROOT / "matrix.yaml").read_text()
    ds = (BROKEN / "deepspeed-ops-for-one-gpu" / "Dockerfile").read_text()
    pin = re.search(r"deepspeed==([\d.]+) --hash=sha256:([0-9a-f]{64})", ds)
    locked = [
        f
        for f in glob.glob(str(ROOT / "locks" / f"*deepspeed{pin[1]}*.txt"))
        if f"--hash=sha256:{pin[2]}" in Path(f).read_text()
    ]
    assert pin and locked, "deepspeed-ops-for-one-gpu: its sdist pin is in no DeepSpeed lock of locks/"


# ----------------------------------------------------------------------------- foreign images
# The recorded verdict of an image trainbase did not build (tests/foreign/*/outcomes.json): every
# check's state, and a pattern for each failure's message.

ROOT_REFUSAL = "AssertionError: mpirun as root exited 1: mpirun has detected an attempt to run as root."
OUTCOMES = {
    "tiers": "static,cpu",
    "must_fail": {
        "test_mpi::test_root_without_flags": {
            "message": r"mpirun has detected an attempt to run as root",
            "why": "Open MPI refuses root",
        }
    },
    "states": {"test_mpi::test_ompi_info_version": "passed", "test_cuda::test_cudnn_version": "skipped"},
}


def foreign_run(*cases: tuple[str, str, str, str]) -> list[verdict.Case]:
    """(module, name, state, message) per case, with the classname the installed suite writes."""
    body = ""
    for module, name, state, message in cases:
        tag = {"failed": "failure", "error": "error", "skipped": "skipped"}.get(state)
        child = f"<{tag} message={quoteattr(message)}>details</{tag}>" if tag else ""
        body += (
            f'<testcase classname="trainbase_conformance.checks.{module}" name={quoteattr(name)} time="0.1">'
            f"{child}</testcase>"
        )
    return verdict.cases_from_junit(f'<testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')


AS_RECORDED = [
    ("test_mpi", "test_root_without_flags[img]", "failed", ROOT_REFUSAL),
    ("test_mpi", "test_ompi_info_version[img]", "passed", ""),
    ("test_cuda", "test_cudnn_version[img]", "skipped", "n/a: the expectations declare no cuDNN"),
]


def test_the_recorded_verdict_is_accepted():
    assert verdict.judge_recorded(OUTCOMES, foreign_run(*AS_RECORDED)) == []


def test_a_check_drifting_from_passed_to_skipped_is_named():
    """Only the set of failures was compared before: this drift went unnoticed."""
    run = [
        AS_RECORDED[0],
        ("test_mpi", "test_ompi_info_version[img]", "skipped", "n/a: no ompi_info on PATH"),
        AS_RECORDED[2],
    ]
    assert verdict.judge_recorded(OUTCOMES, foreign_run(*run)) == [
        "test_mpi::test_ompi_info_version skipped, recorded passed: n/a: no ompi_info on PATH"
    ]


def test_a_recorded_failure_for_another_reason_is_named():
    other = "AssertionError: mpirun as root exited 1: mpirun was unable to launch the specified application"
    [problem] = verdict.judge_recorded(
        OUTCOMES, foreign_run(("test_mpi", "test_root_without_flags[img]", "failed", other), *AS_RECORDED[1:])
    )
    assert "failed for another reason" in problem and "unable to launch" in problem


def test_a_new_check_and_a_gone_one_are_named():
    run = [*AS_RECORDED[:2], ("test_cuda", "test_cublas_version[img]", "skipped", "n/a: no CUDA")]
    assert verdict.judge_recorded(OUTCOMES, foreign_run(*run)) == [
        "test_cuda::test_cublas_version skipped, and outcomes.json records no state for it (a new check: record it): "
        "n/a: no CUDA",
        "test_cuda::test_cudnn_version is recorded skipped but did not run (renamed or removed?)",
    ]


def test_record_writes_every_state_but_the_failures(tmp_path, capsys):
    path = tmp_path / "img" / "outcomes.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**OUTCOMES, "states": {}}))
    junit_file = tmp_path / "junit.xml"
    cases = AS_RECORDED
    body = "".join(
        f'<testcase classname="trainbase_conformance.checks.{m}" name={quoteattr(n)}>'
        + (f"<{ {'failed': 'failure', 'skipped': 'skipped'}[s] } message={quoteattr(msg)}/>" if s != "passed" else "")
        + "</testcase>"
        for m, n, s, msg in cases
    )
    junit_file.write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")
    assert verdict.main([str(junit_file), "--foreign", str(path), "--verdict-only"]) == 1
    assert "NOT the recorded verdict" in capsys.readouterr().out
    assert verdict.main([str(junit_file), "--foreign", str(path), "--record", "--verdict-only"]) == 0
    assert json.loads(path.read_text())["states"] == OUTCOMES["states"]
