"""Every conformance check is shown failing, or says why not (tests/conformance/failures.py): each
`test_*` of trainbase_conformance/checks has a broken variant, a unit test or a foreign-image failure,
or a `none` entry with a why in tests/conformance/failures.yaml; entries name checks, unit tests and
variants that exist; and docs/conformance.md's table is what the generator writes now. Each rule is
also shown catching a planted defect."""

import json
import re
import shutil
from dataclasses import replace

import pytest

from tests.conformance import failures
from trainbase_conformance import TIERS

from .conftest import ROOT


@pytest.fixture(scope="module")
def table():
    return failures.build()


@pytest.fixture(scope="module")
def entries():
    return failures.load_entries()


def test_the_table_builds_without_a_problem(table):
    assert not table.problems, "\n".join(table.problems)
    assert len(table.checks) > 100 and {c.tier for c in table.checks.values()} == set(TIERS)


# --------------------------------------------------------------------------- (a) an entry for every check


def test_every_check_has_an_entry(table):
    missing = failures.without_entry(table.checks, table.ways, table.nones)
    assert not missing, missing[0]
    for cid in table.checks:
        assert table.ways_of(cid) or table.nones.get(cid), cid


def test_a_check_without_an_entry_is_named(table, entries):
    planted = failures.Check(
        "test_mpi.py::test_planted_new_check", "test_mpi.py", "test_planted_new_check", "cpu", 9999
    )
    checks = {**table.checks, planted.id: planted}
    problems = failures.build(checks=checks, entries=entries).problems
    assert len(problems) == 1 and problems[0].startswith("1 check(s) with no entry"), problems
    assert problems[0].endswith(": test_mpi.py::test_planted_new_check"), problems
    # a none entry with its why is an entry
    said = {**entries, planted.id: {"shown_by": "none", "why": "not yet built: a variant that would show it"}}
    assert failures.build(checks=checks, entries=said).problems == []


def test_a_check_without_exactly_one_tier_is_refused(tmp_path, monkeypatch):
    pkg = tmp_path / "planted_failure_table_checks"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "test_planted_tiers.py").write_text(
        "import pytest\n\n@pytest.mark.static\n@pytest.mark.cpu\ndef test_two(target):\n    pass\n\n"
        "def test_none(target):\n    pass\n\n@pytest.mark.gpu\ndef test_one(target):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    checks, problems = failures.collect_checks(pkg, pkg.name)
    assert (
        list(checks) == ["test_planted_tiers.py::test_one"] and checks["test_planted_tiers.py::test_one"].tier == "gpu"
    )
    assert sorted(p.split(":")[2] for p in problems) == ["test_none", "test_two"], problems


# --------------------------------------------------------------------------- (b) entries name real checks


def test_entries_name_real_checks(table, entries):
    assert set(entries) <= set(table.checks), sorted(set(entries) - set(table.checks))
    assert {w.check for w in table.ways} <= set(table.checks)


@pytest.mark.parametrize(
    "cid", ["test_mpi.py::test_no_such_check", "test_nope.py::test_root_without_flags", "test_root_without_flags"]
)
def test_an_entry_naming_no_check_is_refused(table, entries, cid):
    planted = {**entries, cid: {"shown_by": "none", "why": "not yet built: a variant that would show it"}}
    problems = failures.build(checks=table.checks, entries=planted).problems
    assert problems == [
        f"failures.yaml: {cid} is no check (not a test_* function of trainbase_conformance/checks/{cid.split('::')[0]})"
    ], problems


def test_a_foreign_failure_of_no_check_is_refused(table, tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "outcomes.json").write_text(
        json.dumps(
            {"must_fail": {"test_mpi::test_root_without_flags": "refuses root", "test_mpi::test_gone": "was renamed"}}
        )
    )
    ways, problems = failures.foreign_ways(table.checks, tmp_path)
    assert [(w.check, w.source) for w in ways] == [("test_mpi.py::test_root_without_flags", "img")]
    assert problems == ["foreign img: test_mpi::test_gone is no check"]


# --------------------------------------------------------------------------- (c) unit entries name tests


def test_unit_entries_name_existing_tests(table, entries):
    units = {cid: e["unit"] for cid, e in entries.items() if e.get("shown_by") == "unit"}
    assert units, "failures.yaml lists the unit tests that show checks failing"
    for cid, node in units.items():
        assert failures.unit_test_exists(node) is None, (cid, node)
    assert {w.check: w.source for w in table.ways if w.kind == "unit"} == units


@pytest.mark.parametrize(
    "node, why",
    [
        (
            "tests/unit/test_gpu_tier_counts.py::test_no_such_test",
            "tests/unit/test_gpu_tier_counts.py defines no test test_no_such_test",
        ),
        ("tests/unit/test_nope.py::test_x", "tests/unit/test_nope.py: no such file"),
        (
            "tests/unit/test_gpu_tier_counts.py::FakeTarget::test_x",
            "tests/unit/test_gpu_tier_counts.py defines no test test_x",
        ),
        (
            "tests/unit/test_gpu_tier_counts.py::NoClass::test_x",
            "tests/unit/test_gpu_tier_counts.py defines no class NoClass",
        ),
        ("tests/build/test_build.py::test_x", "not a node id tests/unit/FILE.py::TEST (or ::CLASS::TEST)"),
        ("tests/unit/test_gpu_tier_counts.py", "not a node id tests/unit/FILE.py::TEST (or ::CLASS::TEST)"),
        (
            "tests/unit/test_gpu_tier_counts.py::test_the_nccl_allreduce_fails_on_fewer_gpus_or_no_bus_traffic[8-1-0.0]",
            "name the test function, without a parametrization",
        ),
    ],
)
def test_a_unit_entry_naming_no_test_is_refused(table, entries, node, why):
    cid = "test_cuda.py::test_cuda_kernel"
    planted = {**entries, cid: {"shown_by": "unit", "unit": node, "message": "kernel check failed"}}
    problems = failures.build(checks=table.checks, entries=planted).problems
    assert problems == [f"failures.yaml: {cid}: unit {node!r}: {why}"], problems


def test_a_unit_entry_without_a_message_or_with_a_typo_is_refused(table, entries):
    cid = "test_cuda.py::test_cuda_kernel"
    node = "tests/unit/test_gpu_tier_counts.py::test_the_device_query_fails_when_the_container_sees_one_of_eight"
    problems = failures.build(
        checks=table.checks, entries={**entries, cid: {"shown_by": "unit", "unit": node, "mesage": "typo"}}
    ).problems
    assert problems == [
        f"failures.yaml: {cid}: unknown keys ['mesage'] for shown_by unit",
        f"failures.yaml: {cid}: a unit entry needs the message the check gives",
    ], problems


# --------------------------------------------------------------------------- (d) variants come from expect.json


def test_variant_entries_come_from_existing_expect_json(table):
    variants = [w for w in table.ways if w.kind == "variant"]
    assert len({w.source for w in variants}) == len(list(failures.BROKEN.glob("*/expect.json")))
    for w in variants:
        folder = failures.BROKEN / w.source
        assert (folder / "Dockerfile").exists(), w
        expect = json.loads((folder / "expect.json").read_text())
        check = table.checks[w.check]
        # a claim judged on any engine, or one a GPU runner judges (gpu_must_fail over gpu_paths)
        key, paths = ("must_fail", "paths") if check.name in expect["must_fail"] else ("gpu_must_fail", "gpu_paths")
        assert check.file in expect.get(paths, []) and check.name in expect.get(key, {}), w
        assert key == "must_fail" or check.tier == "gpu", f"{w}: only a check of the gpu tier is a GPU runner's claim"
        spec = expect[key][check.name]
        assert w.message == (spec if isinstance(spec, str) else spec["message"]), w


@pytest.mark.parametrize(
    "name, reported",
    [
        ("no-nccl", "no-nccl claims it: drop this duplicate"),
        ("no-such-variant", "no-such-variant does not claim it (claimed by: no-nccl)"),
        ("stale-sbom", "stale-sbom does not claim it (claimed by: no-nccl)"),
    ],
)
def test_a_variant_written_into_the_yaml_is_refused(table, entries, name, reported):
    cid = "test_nccl.py::test_one_nccl"
    planted = {**entries, cid: {"shown_by": "variant", "variant": name, "message": "x"}}
    problems = failures.build(checks=table.checks, entries=planted).problems
    assert len(problems) == 1 and problems[0].startswith(f"failures.yaml: {cid}: variant entries are read from")
    assert problems[0].endswith(reported), problems


def test_a_variant_claiming_a_check_outside_its_paths_is_refused(table, tmp_path):
    shutil.copytree(failures.BROKEN / "no-nccl", tmp_path / "no-nccl")
    expect = json.loads((tmp_path / "no-nccl" / "expect.json").read_text())
    (tmp_path / "no-nccl" / "expect.json").write_text(json.dumps({**expect, "paths": ["test_mpi.py"]}))
    shutil.copytree(failures.BROKEN / "leaked-ca", tmp_path / "no-dockerfile")
    (tmp_path / "no-dockerfile" / "Dockerfile").unlink()
    ways, problems = failures.variant_ways(table.checks, tmp_path)
    assert ways == []
    assert problems == ["variant no-dockerfile: an expect.json without a Dockerfile"] + [
        f"variant no-nccl claims {c}, which 0 of its paths ['test_mpi.py'] define"
        for c in ("test_nccl_loads", "test_nccl_version", "test_one_nccl")
    ]


# --------------------------------------------------------------------------- none entries


def test_a_none_entry_says_why_and_only_for_a_check_without_a_failure(table, entries):
    shown, bare = "test_nccl.py::test_one_nccl", "test_cuda.py::test_cuda_kernel"
    problems = failures.build(
        checks=table.checks,
        entries={
            **entries,
            shown: {"shown_by": "none", "why": "not yet built: a variant that would show it"},
            bare: {"shown_by": "none"},
        },
    ).problems
    assert sorted(problems) == [
        f"failures.yaml: {bare}: shown_by none needs a why (why no failure can be built here, or 'not yet built: ...')",
        f"failures.yaml: {shown}: says none, but variant no-nccl shows it failing: drop the none entry",
    ], problems


def test_an_unknown_way_is_refused(table, entries):
    cid = "test_cuda.py::test_cuda_kernel"
    problems = failures.build(checks=table.checks, entries={**entries, cid: {"shown_by": "gpu-runner"}}).problems
    assert problems[0] == (
        f"failures.yaml: {cid}: shown_by 'gpu-runner', want unit or none (variant and foreign "
        "entries come from expect.json and outcomes.json)"
    ), problems


# --------------------------------------------------------------------------- (e) the docs' table


def test_the_docs_table_is_what_the_generator_writes(table):
    problem = failures.drift_problem(failures.DOC.read_text(), failures.render(table))
    assert problem is None, problem


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.replace(
            "| `test_nccl.py::test_one_nccl` | static | variant", "| `test_nccl.py::test_one_nccl` | cpu | variant"
        ),
        lambda s: re.sub(r"\n\| `test_hygiene.py::test_no_run_secrets` [^\n]*", "", s),
        lambda s: re.sub(
            r"(\d+) of (\d+) checks are shown failing",
            lambda m: f"{int(m[1]) + 1} of {m[2]} checks are shown failing",
            s,
        ),
    ],
)
def test_a_stale_or_edited_docs_table_is_reported(table, change):
    doc = failures.DOC.read_text()
    edited = change(doc)
    assert edited != doc
    problem = failures.drift_problem(edited, failures.render(table))
    assert (
        problem
        and problem.startswith("the failures table in docs/conformance.md is not what the generator writes now")
        and problem.endswith("run `.venv/bin/python -m tests.conformance.failures`")
    ), problem


def test_docs_without_the_markers_are_reported(table):
    doc = failures.DOC.read_text().replace(failures.END, "")
    assert "must hold one" in failures.drift_problem(doc, failures.render(table))


def test_the_command_checks_and_rewrites_the_table(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "conformance.md"
    monkeypatch.setattr(failures, "DOC", doc)
    monkeypatch.setattr(failures, "ROOT", tmp_path)
    stale = (
        (ROOT / "docs" / "conformance.md")
        .read_text()
        .replace("| `test_nccl.py::test_one_nccl` | static |", "| `test_nccl.py::test_one_nccl` | gpu |")
    )
    doc.write_text(stale)
    assert failures.main(["--check"]) == 1
    assert "run `.venv/bin/python -m tests.conformance.failures`" in capsys.readouterr().err
    assert failures.main([]) == 0 and doc.read_text() == (ROOT / "docs" / "conformance.md").read_text()
    assert failures.main(["--check"]) == 0


def test_the_table_lists_every_check_with_its_tier_and_the_counts(table):
    block = failures.render(table)
    for c in table.checks.values():
        assert f"| `{c.id}` | {c.tier} |" in block, c.id
    shown = len(table.primary())
    m = re.search(r"\n(\d+) of (\d+) checks are shown failing; (\d+) have no failure yet[:.]\n", block)
    assert m and (int(m[1]), int(m[2]), int(m[3])) == (shown, len(table.checks), len(table.checks) - shown)
    for cid, why in table.nones.items():
        assert f"  - `{cid}`: {' '.join(why.split())}" in block


def test_a_cell_keeps_pipes_and_backticks_inside_its_code_span():
    assert failures.code("a|b") == "`a\\|b`"
    assert failures.code("x `y` z") == "``x `y` z``"
    assert failures.code("`edge`") == "`` `edge` ``"


def test_a_planted_way_changes_the_table(table):
    """The table is computed from the ways: one more unit entry is one more row and one check less
    without a failure."""
    cid = "test_cuda.py::test_cuda_kernel"  # shown by a unit test only: taken away, it has none
    less = replace(
        table, ways=[w for w in table.ways if w.check != cid], nones={**table.nones, cid: "not yet built: planted"}
    )
    assert cid not in less.primary()
    more = replace(
        less,
        ways=less.ways + [failures.Way(cid, "unit", "tests/unit/x.py::test_y", "kernel check failed")],
        nones=table.nones,
    )
    before, after = failures.render(less), failures.render(more)
    assert "unit test `tests/unit/x.py::test_y` | `kernel check failed` |" in after
    shown = len(less.primary())
    assert f"{shown} of {len(table.checks)} checks" in before and f"{shown + 1} of {len(table.checks)} checks" in after


# --------------------------------------------------------------------------- ways that do not count


def test_a_variant_ci_never_builds_is_listed_not_counted(table):
    frameworks, mpis = failures.ci_builds()
    assert frameworks == {"pytorch"} and mpis == {"openmpi", "intelmpi"}
    unbuilt = {w.source for w in table.ways if w.kind == "variant" and w.uncounted}
    assert unbuilt == {
        "deepspeed-op-not-prebuilt",
        "deepspeed-ops-for-one-gpu",
        "horovod-without-gpu-operations",
        "no-nvcc",
        "tensorflow-without-cufft",
    }, unbuilt
    # built: the variants of the ci profile's images, and a GPU runner's claims (gpu.yml)
    assert not any(w.uncounted for w in table.ways if w.source in ("no-nccl", "second-nccl-beside-torch"))
    # where CI built a DeepSpeed image, its variants would count
    ways, _ = failures.variant_ways(table.checks, built=({"pytorch", "deepspeed", "horovod", "tensorflow"}, mpis))
    assert not any(w.uncounted for w in ways)


def test_a_check_shown_only_by_ways_that_do_not_count_is_not_shown(table):
    cid = "test_gpu_paths.py::test_deepspeed_prebuilt_ops_load_without_a_compiler_run"
    assert table.primary()[cid] == "unit"
    less = replace(table, ways=[w for w in table.ways if not (w.check == cid and w.kind == "unit")])
    assert cid not in less.primary()
    block = failures.render(less)
    assert f"  - `{cid}`: only ways that do not count: variant deepspeed-op-not-prebuilt (not built by CI" in block
    assert "**not counted**, not built by CI: it needs a deepspeed image" in block


def test_a_foreign_failure_of_a_shared_precondition_is_not_counted(table):
    knock_ons = sorted(w.check for w in table.ways if w.kind == "foreign" and w.uncounted)
    assert knock_ons == [
        # the expectations file declares no UCX, which the image holds: stopped before their asserts
        "test_ib.py::test_ucx_ib_transports_load",
        "test_ib.py::test_ucx_version",
        # the same for libfabric: Ubuntu's libopenmpi3 pulls libfabric1, the expectations name none
        "test_libfabric.py::test_libfabric_cuda_support_finds_the_images_cudart",
        "test_libfabric.py::test_libfabric_is_the_declared_release_with_its_providers",
        "test_mpi.py::test_mpi4py_allreduce_4_ranks",
        "test_mpi.py::test_mpicc_allreduce_4_ranks",
        "test_mpi.py::test_ompi_ucx_is_manifest_ucx",
        "test_mpi.py::test_ompi_ucx_loads_ib_transports",
        "test_mpi.py::test_ompi_ucx_pml_runs",
        "test_mpi.py::test_shared_memory_without_warnings",
        "test_speed.py::test_intra_node_bandwidth_is_near_the_hosts",
        "test_speed.py::test_intra_node_messages_stay_off_the_network_stack",
    ], knock_ons
    for cid in knock_ons:  # each has evidence of its own assert failing
        assert table.primary().get(cid) in ("variant", "unit"), cid
