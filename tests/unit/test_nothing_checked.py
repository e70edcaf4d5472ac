"""The suite never says green about what it did not check (issue 63), shown on fake images: no
Docker, no GPU.

1. An expectations file that declares only ``python`` skipped every check of the image, hygiene
   too ("declares no 'mpi'"), and the run exited 0: the image's MPI was asked for once for all
   its checks. Now only a check that needs a component skips without it, and only where the
   image holds none of it (saying what to declare); where it holds one, the check fails.
2. ``--expect FILE`` on an image with its own manifest was dropped without a word: an
   expectations file claiming NCCL 9.9.9 passed. Now each claim the manifest does not make
   fails the image's verdict.
3. The summary named ``trainbase-bootstrap/debian:12.15-slim`` as ``debian:12.15-slim``.

And the verdict (checks/test_verdict.py): an image for which no check ran, or only the checks
that need no declaration with nothing declared and nothing found, fails the run in one line
saying so and what to declare; the summary counts, per image, the checks that ran against those
skipped for want of a declaration."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainbase_conformance import expectations, session
from trainbase_conformance.checks import (
    test_frameworks,
    test_ib,
    test_integrity,
    test_mpi,
    test_nccl,
    test_supply_chain,
    test_verdict,
)
from trainbase_conformance.fixtures import Target, mpi_flavor
from trainbase_conformance.resources import CHECKS, EXPECTATIONS_SCHEMA
from trainbase_conformance.results import VERDICT_MODULE, Results

from .conftest import ROOT

IMAGE = "trainbase-bootstrap/debian:12.15-slim"
MANIFEST = {
    "name": "openmpi4.1.4-cuda12.8-cudnn9-debian12",
    "components": {
        "python": {"prefix": "/opt/trainbase/venv", "version": "3.11", "mpi4py": "4.1.2"},
        "mpi": {"kind": "openmpi", "version": "4.1.4", "prefix": "/opt/openmpi"},
        "nccl": {"version": "2.27.3", "package": "nvidia-nccl-cu12"},
        "ib": {"kind": "rdma-core", "providers": ["mlx5", "efa"]},
    },
    "frameworks": {},
}


class Host:
    """testinfra's host of a fake image: ``answer(cmd)`` gives (rc, stdout, stderr) for the
    command the check runs (inside the `timeout N /bin/sh -c ...` it is wrapped in)."""

    def __init__(self, answer):
        self.answer, self.ran = answer, []

    def run(self, cmd):
        self.ran.append(cmd)
        rc, out, err = self.answer(cmd)
        return SimpleNamespace(rc=rc, stdout=out, stderr=err)


def nothing(cmd):
    return 127, "", "not found"


def target(manifest, answer=nothing, labels=None, files=None, ref=IMAGE) -> Target:
    """A real Target (the fixture's own logic: need_mpi, require, holds) on a fake image."""
    mpi, why = mpi_flavor(manifest)
    files = files or {}

    def read(path):
        if path not in files:
            raise FileNotFoundError(path)
        return files[path]

    return Target(
        ref=ref,
        inspect={"Config": {"Labels": labels or {}}},
        manifest=manifest,
        container=SimpleNamespace(read=read),
        host=Host(answer),
        caps=None,
        mpi=mpi,
        mpi_error=why,
    )


def foreign(text: str, tmp_path: Path) -> dict:
    p = tmp_path / "e.yaml"
    p.write_text(text)
    return expectations.as_manifest(expectations.load(p), IMAGE, p.name)


def holding(*paths: str, **more):
    """An image whose filesystem holds ``paths`` (what the find of expectations.find_command
    prints), and answers ``more`` (a substring of the command -> (rc, stdout, stderr))."""

    def answer(cmd):
        if "-prune -o" in cmd and "libnccl.so*" in cmd and "-packages/torch" in cmd:
            return 0, "\n".join(paths) + "\n", ""
        for key, a in more.items():
            if key.replace("_", " ") in cmd or key in cmd:
                return a
        return nothing(cmd)

    return answer


# --------------------------------------------------------------------------- 1. undeclared components


def test_an_image_without_an_mpi_is_no_skip_of_all_its_checks(tmp_path):
    """The bug as met: `python: {prefix: /usr}` alone, and the MPI was asked for while the image's
    fixture was made, which skipped all 56 checks of the image, the hygiene ones included."""
    m = foreign("python: {prefix: /usr}\n", tmp_path)
    assert mpi_flavor(m) == (None, "the manifest names no MPI (components.mpi)")  # no Skipped raised
    t = target(m)
    with pytest.raises(
        pytest.skip.Exception, match=r"e\.yaml declares no 'mpi' and the image holds none: declare `mpi"
    ):
        t.need_mpi()


def test_a_component_the_image_holds_but_the_file_does_not_declare_fails(tmp_path):
    t = target(foreign("python: {prefix: /usr}\n", tmp_path), holding("/usr/bin/mpirun", "/usr/lib/libucp.so.0"))
    with pytest.raises(
        pytest.fail.Exception,
        match=r"the image holds an MPI launcher \(/usr/bin/mpirun\) but e\.yaml declares no 'mpi': declare `mpi: ",
    ):
        t.need_mpi()
    with pytest.raises(
        pytest.fail.Exception, match=r"holds UCX \(/usr/lib/libucp\.so\.0\) but e\.yaml declares no 'ucx'"
    ):
        t.components["ucx"]
    with pytest.raises(pytest.skip.Exception, match=r"declares no 'cuda' and the image holds none"):
        t.components["cuda"]
    # a trainbase manifest without its MPI is a failure, as before
    with pytest.raises(pytest.fail.Exception, match=r"names no MPI"):
        target({"components": {"python": {"prefix": "/usr"}}}).need_mpi()


def test_what_the_image_holds_is_sorted_by_component():
    out = expectations.found(
        "/usr/bin/mpiexec\n/opt/v/lib/python3.11/site-packages/torch/__init__.py\n/usr/lib/libnccl-net.so\n"
        "/usr/lib/x86_64-linux-gnu/libibverbs.so.1\n/opt/v/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2\n"
    )
    assert out == {
        "mpi": ["/usr/bin/mpiexec"],
        "frameworks.pytorch": ["/opt/v/lib/python3.11/site-packages/torch/__init__.py"],
        "ib": ["/usr/lib/x86_64-linux-gnu/libibverbs.so.1"],
        "nccl": ["/opt/v/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"],
        "nccl_net_plugin": ["/usr/lib/libnccl-net.so"],
    }
    assert "-name 'libnccl.so*'" in expectations.find_command() and "-xdev" in expectations.find_command()


def test_a_skip_for_want_of_a_declaration_is_told_from_one_that_does_not_apply():
    with pytest.raises(pytest.skip.Exception) as e:
        expectations.undeclared("e.yaml", "frameworks.pytorch", [])
    assert expectations.undeclared_component(str(e.value.msg)) == "frameworks.pytorch"
    assert "declare `frameworks: {pytorch: " in str(e.value.msg)
    assert expectations.undeclared_component("n/a: intelmpi (Open MPI only)") is None
    # the failure for a held component is no skip for want of a declaration
    with pytest.raises(pytest.fail.Exception) as f:
        expectations.undeclared("e.yaml", "nccl", ["/a/libnccl.so.2", "/b/libnccl.so.2", "/c", "/d"])
    assert "and 1 more" in str(f.value.msg)


def test_an_undeclared_framework_skips_where_absent_and_fails_where_installed(tmp_path):
    m = foreign("python: {prefix: /usr}\n", tmp_path)
    with pytest.raises(pytest.skip.Exception, match=r"declares no 'frameworks\.pytorch' and the image holds none"):
        test_frameworks.need(target(m), "pytorch")
    held = target(m, holding("/usr/lib/python3/dist-packages/torch/__init__.py"))
    with pytest.raises(pytest.fail.Exception, match=r"holds pytorch \(/usr/lib/python3/dist-packages/torch"):
        test_frameworks.need(held, "pytorch")
    # a trainbase image without the framework: not applicable, as before
    with pytest.raises(pytest.skip.Exception, match=r"has no pytorch \(its manifest lists: none\)"):
        test_frameworks.need(target(MANIFEST), "pytorch")


# --------------------------------------------------------------------------- the checks that changed


def launcher(version_line: str, real: str = "/opt/openmpi/bin/mpirun", rc: int = 0):
    def answer(cmd):
        if "command -v" in cmd and "--version" in cmd:
            return rc, f"{real}\n{version_line}\n", ""
        if "command -v mpirun" in cmd or "command -v mpiexec" in cmd:
            return 0, real, ""
        return nothing(cmd)

    return answer


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (
            launcher("mpirun (Open MPI) 4.1.5"),
            r"`mpirun` \(/opt/openmpi/bin/mpirun\) reports 4\.1\.5, the manifest says",
        ),
        (launcher("mpirun (Open MPI) 4.1.4", real="/usr/bin/mpirun"), r"is /usr/bin/mpirun, not under the manifest's"),
        (launcher("usage: mpirun"), r"`mpirun --version` names no version"),
        (launcher("", rc=127), r"`mpirun` does not resolve or run \(exit 127\)"),
    ],
)
def test_the_launcher_check_fails_on_another_version_prefix_or_no_launcher(answer, why):
    test_mpi.test_launchers_on_path_are_the_manifests_mpi(
        target(MANIFEST, launcher("mpirun (Open MPI) 4.1.4")), "login"
    )
    with pytest.raises(AssertionError, match=why):
        test_mpi.test_launchers_on_path_are_the_manifests_mpi(target(MANIFEST, answer), "non-login")


def test_the_launcher_and_shell_contract_needs_no_declaration(tmp_path):
    """An image whose file declares no MPI: a launcher found on PATH must still resolve and name
    its version in both shells; none on PATH (and none in the image) is a skip saying so."""
    m = foreign("python: {prefix: /usr}\n", tmp_path)
    test_mpi.test_launchers_on_path_are_the_manifests_mpi(target(m, launcher("mpirun (Open MPI) 4.1.4")), "login")
    with pytest.raises(AssertionError, match=r"`mpirun --version` names no version"):
        test_mpi.test_launchers_on_path_are_the_manifests_mpi(target(m, launcher("segfault")), "login")
    with pytest.raises(pytest.skip.Exception, match=r"declares no 'mpi' and the image holds none"):
        test_mpi.test_launchers_on_path_are_the_manifests_mpi(target(m), "non-login")


def python_says(facts: dict | None, rc: int = 0):
    def answer(cmd):
        if "sys.version_info" in cmd:
            return rc, json.dumps(facts) + "\n" if facts else "", "" if rc == 0 else "No such file or directory"
        return nothing(cmd)

    return answer


@pytest.mark.parametrize(
    ("facts", "rc", "why"),
    [
        (None, 127, r"the declared Python /opt/trainbase/venv/bin/python does not run \(exit 127\)"),
        ({"version": "3.12", "prefix": "/opt/trainbase/venv", "mpi4py": "4.1.2"}, 0, r"'version': '3\.12'"),
        ({"version": "3.11", "prefix": "/usr", "mpi4py": "4.1.2"}, 0, r"'prefix': '/usr'.*the image declares"),
        ({"version": "3.11", "prefix": "/opt/trainbase/venv", "mpi4py": None}, 0, r"'mpi4py': None"),
    ],
)
def test_the_declared_python_must_run_at_its_prefix_version_and_mpi4py(facts, rc, why):
    good = {"version": "3.11", "prefix": "/opt/trainbase/venv/", "mpi4py": "4.1.2"}
    test_integrity.test_the_declared_python_runs(target(MANIFEST, python_says(good)))
    with pytest.raises(AssertionError, match=why):
        test_integrity.test_the_declared_python_runs(target(MANIFEST, python_says(facts, rc)))


def test_a_file_that_declares_only_the_prefix_is_held_to_the_prefix(tmp_path):
    m = foreign("python: {prefix: /opt/miniconda}\n", tmp_path)
    test_integrity.test_the_declared_python_runs(
        target(m, python_says({"version": "3.8", "prefix": "/opt/miniconda", "mpi4py": None}))
    )
    with pytest.raises(
        AssertionError, match=r"is \{'prefix': '/usr'\}, the image declares \{'prefix': '/opt/miniconda'\}"
    ):
        test_integrity.test_the_declared_python_runs(target(m, python_says({"version": "3.8", "prefix": "/usr"})))


def nccl_files(*files: str, loads: str = "/usr/lib/libnccl.so.2", real: str | None = None):
    def answer(cmd):
        if "libnccl.so*" in cmd and "-type f -print" in cmd:
            return 0, "\n".join(files) + "\n", ""
        if "libversions.py" in cmd:
            return 0, json.dumps({"nccl": {"path": loads, "version": 22703}}) + "\n", ""
        if "readlink -f" in cmd:
            return 0, (real or loads) + "\n", ""
        return nothing(cmd)

    return answer


def test_one_nccl_fails_on_two_or_on_another_than_the_linker_loads(tmp_path):
    test_nccl.test_one_nccl(target(MANIFEST, nccl_files("/usr/lib/libnccl.so.2")))
    with pytest.raises(AssertionError, match=r"2 NCCL libraries in the image: \['/opt/x/libnccl\.so\.2', "):
        test_nccl.test_one_nccl(target(MANIFEST, nccl_files("/usr/lib/libnccl.so.2", "/opt/x/libnccl.so.2")))
    with pytest.raises(AssertionError, match=r"the linker loads /opt/y/libnccl\.so\.2, the image's NCCL file is"):
        test_nccl.test_one_nccl(target(MANIFEST, nccl_files("/usr/lib/libnccl.so.2", real="/opt/y/libnccl.so.2")))

    def no_load(cmd):
        if "libversions.py" in cmd:
            return 0, json.dumps({"nccl": {"error": "libnccl.so.2: cannot open shared object file"}}) + "\n", ""
        return nccl_files("/usr/lib/libnccl.so.2")(cmd)

    with pytest.raises(AssertionError, match=r"libnccl\.so\.2 does not load: libnccl\.so\.2: cannot open"):
        test_nccl.test_one_nccl(target(MANIFEST, no_load))
    # no NCCL declared and none in the image: skipped, where it failed with "0 NCCL libraries"
    with pytest.raises(pytest.skip.Exception, match=r"declares no 'nccl' and the image holds none"):
        test_nccl.test_one_nccl(target(foreign("python: {prefix: /usr}\n", tmp_path), nccl_files()))


def tools(missing: tuple[str, ...] = (), silent: tuple[str, ...] = ()):
    def answer(cmd):
        tool = next((t for t in test_ib.TOOL_RUNS if f"command -v {t} " in cmd), None)
        if tool in missing:
            return 127, "", ""
        if tool in silent:
            return 0, "", ""
        if tool:
            return 0, f"{tool} version 1\n", ""
        return nothing(cmd)

    return answer


def test_the_rdma_tools_check_fails_on_a_missing_or_silent_tool_and_skips_without_an_ib(tmp_path):
    test_ib.test_rdma_tools_run(target(MANIFEST, tools()))
    with pytest.raises(AssertionError, match=r"RDMA tools that do not run:\n\s*ibstat: exit 127: not on PATH"):
        test_ib.test_rdma_tools_run(target(MANIFEST, tools(missing=("ibstat",))))
    with pytest.raises(AssertionError, match=r"rdma: `rdma -V` printed nothing \(exit 0\)"):
        test_ib.test_rdma_tools_run(target(MANIFEST, tools(silent=("rdma",))))
    # debian:12.15-slim with `python: {prefix: /usr}`: it failed "not on PATH"; no ib, no libibverbs: skipped
    with pytest.raises(pytest.skip.Exception, match=r"declares no 'ib' and the image holds none"):
        test_ib.test_rdma_tools_run(
            target(foreign("python: {prefix: /usr}\n", tmp_path), tools(missing=test_ib.TOOL_RUNS))
        )


SBOM = "/etc/trainbase/sbom/x.cdx.json"


def sbom_image(
    manifest, dpkg="bash\t5.2\n", pypi=(("mpi4py", "4.1.2"),), deb=(("bash", "5.2"),), labels=True, dpkg_rc=0
):
    doc = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "metadata": {"component": {"name": manifest.get("name")}},
        "components": [{"purl": f"pkg:deb/debian/{n}@{v}"} for n, v in deb]
        + [{"purl": f"pkg:pypi/{n}@{v}"} for n, v in pypi],
    }
    text = json.dumps(doc)
    named = {"io.trainbase.sbom": SBOM, "io.trainbase.sbom.sha256": hashlib.sha256(text.encode()).hexdigest()}

    def answer(cmd):
        if "dpkg-query" in cmd:
            return dpkg_rc, dpkg, "dpkg-query: error: no package database" if dpkg_rc else ""
        if "importlib.metadata" in cmd:
            return 0, json.dumps([["mpi4py", "4.1.2"]]) + "\n", ""
        return nothing(cmd)

    return target(manifest, answer, labels=named if labels else {}, files={SBOM: text})


def test_the_sbom_checks_judge_an_sbom_where_the_image_carries_one(tmp_path):
    test_supply_chain.test_sbom_lists_exactly_what_dpkg_and_python_have(sbom_image(MANIFEST))
    with pytest.raises(AssertionError, match=r"SBOM and dpkg disagree: \[\('bash', '5\.2'\), \('bash', '5\.2-1'\)\]"):
        test_supply_chain.test_sbom_lists_exactly_what_dpkg_and_python_have(sbom_image(MANIFEST, dpkg="bash\t5.2-1\n"))
    with pytest.raises(AssertionError, match=r"SBOM and the image's Python disagree: \[\('mpi4py', '4\.0\.0'\)"):
        test_supply_chain.test_sbom_lists_exactly_what_dpkg_and_python_have(
            sbom_image(MANIFEST, pypi=[("mpi4py", "4.0.0")])
        )
    with pytest.raises(AssertionError, match=r"dpkg-query: error: no package database"):
        test_supply_chain.test_sbom_lists_exactly_what_dpkg_and_python_have(sbom_image(MANIFEST, dpkg="", dpkg_rc=2))
    broken = sbom_image(MANIFEST)
    broken.container.read = lambda path: "{}"
    with pytest.raises(AssertionError, match=r"/etc/trainbase/sbom/x\.cdx\.json does not match its label's digest"):
        test_supply_chain.test_sbom_lists_exactly_what_dpkg_and_python_have(broken)
    with pytest.raises(AssertionError, match=r"no io\.trainbase\.sbom / \.sha256 labels"):
        test_supply_chain.test_image_carries_its_cyclonedx_sbom(sbom_image(MANIFEST, labels=False))
    # an image trainbase did not build: judged by the SBOM it carries, skipped where it names none
    m = foreign("name: theirs\npython: {prefix: /usr}\n", tmp_path)
    test_supply_chain.test_image_carries_its_cyclonedx_sbom(sbom_image(m))
    for check in (
        test_supply_chain.test_image_carries_its_cyclonedx_sbom,
        test_supply_chain.test_sbom_lists_exactly_what_dpkg_and_python_have,
    ):
        with pytest.raises(pytest.skip.Exception, match=r"the image names no SBOM .*label its CycloneDX SBOM"):
            check(sbom_image(m, labels=False))


OCI = "org.opencontainers.image."
COMMIT = "b65c5a1987f625df57e6695dfc1208702e621b5b"


def test_the_provenance_labels_are_required_of_trainbase_and_checked_where_others_set_them(tmp_path):
    good = {f"{OCI}revision": COMMIT, f"{OCI}created": "2026-11-28T14:59:21Z", f"{OCI}source": "https://x.org/r"}
    test_supply_chain.test_image_says_which_commit_built_it_and_when(target(MANIFEST, labels=good))
    cases = [
        ({**good, f"{OCI}revision": "main"}, r"revision label 'main' is not a commit"),
        ({**good, f"{OCI}created": "yesterday"}, r"created label 'yesterday'"),
        ({**good, f"{OCI}source": "https://tok@x.org/r"}, r"source label 'https://tok@x\.org/r' is not a URL"),
        ({f"{OCI}created": good[f"{OCI}created"]}, r"revision label '' is not a commit"),
    ]
    for labels, why in cases:
        with pytest.raises(AssertionError, match=why):
            test_supply_chain.test_image_says_which_commit_built_it_and_when(target(MANIFEST, labels=labels))
    m = foreign("python: {prefix: /usr}\n", tmp_path)
    with pytest.raises(pytest.skip.Exception, match=r"sets none of the OCI labels .*label its commit"):
        test_supply_chain.test_image_says_which_commit_built_it_and_when(target(m))
    # each label another image sets is held to the same form; one it does not set is not required
    test_supply_chain.test_image_says_which_commit_built_it_and_when(target(m, labels={f"{OCI}revision": COMMIT}))
    with pytest.raises(AssertionError, match=r"created label 'today'"):
        test_supply_chain.test_image_says_which_commit_built_it_and_when(target(m, labels={f"{OCI}created": "today"}))


# --------------------------------------------------------------------------- 2. --expect beside a manifest


def test_an_expectations_file_beside_a_manifest_is_checked_against_it(tmp_path):
    """The bug as met: NCCL 9.9.9 claimed for an image whose manifest says 2.27.3 passed."""
    e = tmp_path / "e.yaml"
    e.write_text("python: {prefix: /opt/trainbase/venv}\nnccl: {version: '9.9.9'}\nib: {providers: [mlx5, ucx]}\n")
    files = {"/etc/trainbase/manifest.json": json.dumps(MANIFEST)}
    manifest, disagree = expectations.image_claims("img:1", target(MANIFEST, files=files).container, str(e))
    assert manifest == MANIFEST
    assert disagree == [
        "nccl.version: e.yaml says '9.9.9', the manifest '2.27.3'",
        "ib.providers: e.yaml lists ['ucx'], the manifest does not (['mlx5', 'efa'])",
    ]
    e.write_text("name: other\npython: {prefix: /opt/trainbase/venv, version: '3.11'}\ncuda: {version: '12.8'}\n")
    assert expectations.image_claims("img:1", target(MANIFEST, files=files).container, str(e))[1] == [
        "name: e.yaml says 'other', the manifest 'openmpi4.1.4-cuda12.8-cudnn9-debian12'",
        "cuda: e.yaml says {'version': '12.8'}, the manifest says nothing",
    ]
    # a file that agrees: no disagreement; no file: the manifest alone; no manifest: the file
    e.write_text("python: {prefix: /opt/trainbase/venv}\nib: {providers: [efa]}\n")
    assert expectations.image_claims("img:1", target(MANIFEST, files=files).container, str(e))[1] == []
    assert expectations.image_claims("img:1", target(MANIFEST, files=files).container, None) == (MANIFEST, [])
    m, d = expectations.image_claims("img:1", target(MANIFEST).container, str(e))
    assert m["foreign"] and d == []
    with pytest.raises(pytest.fail.Exception, match=r"img:1 carries no /etc/trainbase/manifest\.json"):
        expectations.image_claims("img:1", target(MANIFEST).container, None)


def schema_fields(node: dict, path: str = "") -> set[str]:
    props = node.get("properties")
    if not props:
        return {path}
    return {f for k, v in props.items() for f in schema_fields(v, f"{path}.{k}" if path else k)}


def test_every_field_of_an_expectations_file_is_read_by_a_check():
    """A field no check reads would be a claim the suite silently drops (and a misspelt field a
    check turned off): the schema allows exactly the fields expectations.READERS names, each
    read by a check that exists."""
    import ast

    assert schema_fields(json.loads(EXPECTATIONS_SCHEMA.read_text())) == set(expectations.READERS)
    for field, check in expectations.READERS.items():
        module, name = check.split("::")
        tree = ast.parse((CHECKS / module).read_text())
        assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, (field, check)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("python: {prefix: /usr}\nib: {kind: rdma-core}\n", r"ib: Additional properties are not allowed \('kind'"),
        ("python: {prefix: /usr, versoin: '3.11'}\n", r"python: Additional properties .*'versoin'"),
        ("python: {prefix: /usr}\nnccl: {version: '2.21.5', plugins: []}\n", r"nccl: Additional properties"),
    ],
)
def test_a_field_no_check_reads_is_refused(tmp_path, text, why):
    p = tmp_path / "e.yaml"
    p.write_text(text)
    with pytest.raises(expectations.ExpectationsError, match=why):
        expectations.load(p)


# --------------------------------------------------------------------------- the verdict


def run_of(image: str, *rows: tuple[str, str, str, str], expect: str | None = None):
    """A pytest request whose session recorded ``rows`` (module, check, outcome, message) for
    ``image``, and whose ``target`` fixture is what ``request.target`` is set to."""
    stash = pytest.Stash()
    config = SimpleNamespace(stash=stash, getoption=lambda name: expect if name == "--expect" else None)
    results = session.results(config)
    for module, check, outcome, message in rows:
        results.add(image, module, check, "call", outcome, message, 0.1)
    request = SimpleNamespace(config=config, target=None)
    request.getfixturevalue = lambda name: request.target
    return request


def undeclared_skip(component: str) -> str:
    with pytest.raises(pytest.skip.Exception) as e:
        expectations.undeclared("e.yaml", component, [])
    return str(e.value.msg)


def test_a_run_in_which_no_check_ran_fails_naming_what_to_declare(tmp_path):
    request = run_of(
        IMAGE,
        ("test_nccl", "test_one_nccl", "skipped", undeclared_skip("nccl")),
        ("test_nccl", "test_nccl_version_from_the_library", "skipped", undeclared_skip("nccl")),
        (
            "test_nccl",
            "test_nccl_loads",
            "skipped",
            "not applicable: checks tb-doctor, which only trainbase-built images carry",
        ),
        expect="/tmp/e.yaml",
    )
    with pytest.raises(
        AssertionError,
        match=r"no check ran against trainbase-bootstrap/debian:12\.15-slim: 2 because e\.yaml declares no 'nccl' and "
        r"the image holds none \(declare what it holds: `nccl: \{version: .*; 1 not applicable \(e\.g\. 'not applicable",
    ):
        test_verdict.test_the_image_was_checked_against_its_claims(IMAGE, request)
    # nothing selected applies (-k horovod on an image without Horovod): no pass either
    request = run_of("img:1", ("test_frameworks", "test_horovod_x", "skipped", "img has no horovod"))
    with pytest.raises(AssertionError, match=r"no check ran against img:1: 1 not applicable"):
        test_verdict.test_the_image_was_checked_against_its_claims("img:1", request)


def test_only_the_checks_that_need_no_declaration_on_an_image_of_nothing_fail(tmp_path):
    """debian:12.15-slim with `python: {prefix: /usr}`: its hygiene checks run (and pass), and
    nothing a training image is made of was declared or found."""
    m = foreign("python: {prefix: /usr}\n", tmp_path)
    ran = [
        ("test_hygiene", "test_no_private_keys", "passed", ""),
        ("test_mpi", "test_x", "skipped", undeclared_skip("mpi")),
    ]
    request = run_of(IMAGE, *ran, expect="e.yaml")
    request.target = target(m, holding())
    with pytest.raises(
        AssertionError,
        match=r"only the checks that need no declaration .* ran against trainbase-bootstrap/debian:12\.15-slim: e\.yaml "
        r"declares nothing but 'python' and the image holds none of an MPI launcher, NCCL.*declare what the image",
    ):
        test_verdict.test_the_image_was_checked_against_its_claims(IMAGE, request)
    # what it holds (an undeclared NCCL: its own checks fail) or declares is more than hygiene
    request.target = target(m, holding("/usr/lib/libnccl.so.2"))
    test_verdict.test_the_image_was_checked_against_its_claims(IMAGE, request)
    request.target = target(foreign("python: {prefix: /usr}\nframeworks: {pytorch: '2.5.1'}\n", tmp_path), holding())
    test_verdict.test_the_image_was_checked_against_its_claims(IMAGE, request)


def test_a_disagreeing_expectations_file_fails_the_verdict_though_every_check_passed():
    request = run_of("img:1", ("test_nccl", "test_nccl_version_from_the_library", "passed", ""), expect="/x/e.yaml")
    request.target = target(MANIFEST)
    test_verdict.test_the_image_was_checked_against_its_claims("img:1", request)
    request.target.disagreements = ["nccl.version: e.yaml says '9.9.9', the manifest '2.27.3'"]
    with pytest.raises(
        AssertionError,
        match=r"e\.yaml and img:1's own manifest disagree \(.*\): nccl\.version: e\.yaml says '9\.9\.9', the manifest",
    ):
        test_verdict.test_the_image_was_checked_against_its_claims("img:1", request)


def test_the_summary_counts_what_ran_against_what_was_not_declared_and_names_images_as_given():
    r = Results()
    for module, check, outcome, message in [
        ("test_hygiene", "test_no_private_keys", "passed", ""),
        ("test_integrity", "test_the_declared_python_runs", "failed", "AssertionError: does not run"),
        ("test_mpi", "test_a", "skipped", undeclared_skip("mpi")),
        ("test_mpi", "test_b", "skipped", undeclared_skip("mpi")),
        ("test_cuda", "test_c", "skipped", undeclared_skip("cuda")),
        ("test_doctor", "test_d", "skipped", "not applicable: checks tb-doctor"),
        (
            VERDICT_MODULE,
            "test_the_image_was_checked_against_its_claims",
            "failed",
            "AssertionError: only the checks\nassert []",
        ),
    ]:
        r.add(IMAGE, module, check, "call", outcome, message, 0.1)
    t = r.tally(IMAGE)
    assert (t.ran, t.passed, t.failed, t.not_declared, t.undeclared, len(t.other)) == (
        2,
        1,
        1,
        3,
        {"mpi": 2, "cuda": 1},
        1,
    )
    r.images = {IMAGE: {}}
    md = r.markdown()
    assert f"| {IMAGE} | **FAIL** | 2 | 1 | 1 | 0 | 3 | 1 |" in md
    assert r.ran_line(IMAGE) == (
        f"{IMAGE}: 2 check(s) ran (1 passed, 1 failed), 0 could not start, 3 skipped for want of a declaration "
        "(cuda: 1, mpi: 2), 1 skipped as not applicable; verdict: failed: only the checks"
    )


def test_checks_that_could_not_start_are_no_checks_that_ran():
    """--require-hardware on a host without a GPU: every check errors at its setup; none ran."""
    request = run_of("img:1", ("test_nccl", "test_nccl_allreduce_gpu", "error", "Failed: tier gpu: no usable GPU"))
    with pytest.raises(
        AssertionError, match=r"no check ran against img:1: 1 could not start \(e\.g\. 'Failed: tier gpu"
    ):
        test_verdict.test_the_image_was_checked_against_its_claims("img:1", request)


# --------------------------------------------------------------------------- a real run of nothing


def test_a_run_that_checks_nothing_fails_and_names_the_image_as_given(tmp_path):
    """pytest's own plugin run (no Docker: the gpu tier is skipped before any container on a host
    without a GPU, and the verdict fails before asking for one): every check of the image
    skipped, so its verdict fails the run, which the Markdown summary names by the reference as
    given; -k cannot select the verdict away."""
    if shutil.which("nvidia-smi"):
        pytest.skip("this host has nvidia-smi: the gpu tier would run")
    junit, md = tmp_path / "j.xml", tmp_path / "c.md"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", str(CHECKS), "-m", "gpu", "-k", "nccl", "--image", "absent/image:none"]
        + ["-p", "no:cacheprovider", "-q", "--junitxml", str(junit), "--conformance-report", str(md)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 1, r.stdout[-2000:]
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}  # noqa: S314 -- this run's JUnit
    verdict = cases.pop("test_the_image_was_checked_against_its_claims[image:none]")
    assert "no check ran against absent/image:none" in verdict.find("failure").get("message")
    assert cases and all(c.find("skipped") is not None for c in cases.values())
    assert "| absent/image:none | **FAIL** | 0 |" in md.read_text()
    assert "absent/image:none: 0 check(s) ran" in r.stdout and "verdict: failed: no check ran" in r.stdout
