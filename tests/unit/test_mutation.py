"""The mutation harness of the conformance checks (tests/conformance/mutation.py): its schemata hold
every mutant and the original, chosen by TB_MUTANT at call time; its plan takes the asserts of a
check and of the helpers of its module it calls; a forked run on a planted check kills what its
evidence catches and lets the rest survive; and the report in docs/conformance.md is what the
recorded run gives, every survivor with a reason, the killed share at or above the floor."""

import json
import os
import textwrap

import pytest

from tests.conformance import mutation

TOY = textwrap.dedent('''\
    """A planted check module."""
    from __future__ import annotations


    def helper(x):
        assert x >= 0, f"negative: {x}"
        return x


    def test_toy(target):
        """Doc."""
        assert helper(target) < 10, f"too big: {target}"
        return "ran"


    def test_other(target):
        assert target != 3, "three"
''')


@pytest.fixture
def toy(tmp_path):
    path = tmp_path / "test_toy.py"
    path.write_text(TOY)
    return path


def load(path, key, monkeypatch):
    monkeypatch.setenv(mutation.ENV, key)
    ns = {"__name__": "toy"}
    exec(mutation.schemata_code(path, path.read_bytes()), ns)  # noqa: S102 - the planted module's schemata
    return ns


def test_the_plan_takes_the_check_and_the_helpers_it_calls(toy):
    ms = mutation.plan({"test_toy.py::test_toy": ("tests/unit/x.py::test_y",)}, checks_dir=toy.parent)
    assert [(m.kind, m.site) for m in ms] == [
        ("noop", "test_toy"),
        ("negate", "test_toy.assert1"),
        ("remove", "test_toy.assert1"),
        ("negate", "helper.assert1"),
        ("remove", "helper.assert1"),
    ]
    assert ms[1].id == "test_toy.py::test_toy#negate@test_toy.assert1" and ms[1].where == "test_toy.py:12"
    assert ms[0].id == "test_toy.py::test_toy#noop" and all(m.evidence == ("tests/unit/x.py::test_y",) for m in ms)


def test_the_schemata_hold_the_original_and_each_mutant(toy, monkeypatch):
    ms = {m.id.split("#")[1]: m.key for m in mutation.plan({"test_toy.py::test_toy": ()}, checks_dir=toy.parent)}
    original = load(toy, "", monkeypatch)
    assert original["test_toy"](3) == "ran"
    with pytest.raises(AssertionError, match="too big: 12"):
        original["test_toy"](12)
    with pytest.raises(AssertionError, match="negative: -1"):
        original["test_toy"](-1)
    assert original["test_toy"].__doc__ == "Doc."
    # the evidence sees pytest's rewritten assertion messages, as in a normal run
    with pytest.raises(AssertionError, match=r"assert 12 < 10"):
        original["test_toy"](12)

    noop = load(toy, ms["noop"], monkeypatch)
    assert noop["test_toy"](12) is None and noop["test_toy"](-1) is None
    negated = load(toy, ms["negate@test_toy.assert1"], monkeypatch)
    assert negated["test_toy"](12) == "ran"
    with pytest.raises(AssertionError, match="too big: 3"):
        negated["test_toy"](3)
    removed = load(toy, ms["remove@helper.assert1"], monkeypatch)
    assert removed["test_toy"](-1) == "ran" and removed["test_other"](2) is None
    with pytest.raises(AssertionError, match="three"):
        removed["test_other"](3)


def test_a_run_kills_what_the_evidence_catches(tmp_path, monkeypatch):
    """A planted check whose evidence fails it on one input and passes it on another: the no-op, the
    check's assert negated or removed and the helper's assert negated (it fails the passing input)
    are killed; the helper's assert removed survives (no evidence gives it a negative number)."""
    checks = tmp_path / "checks"
    checks.mkdir()
    (checks / "test_toy.py").write_text(TOY)
    tests = tmp_path / "tests" / "unit"
    tests.mkdir(parents=True)
    (tests / "test_toy_evidence.py").write_text(
        textwrap.dedent("""\
        import pytest
        from toy_checks import test_toy

        def test_too_big_fails():
            with pytest.raises(AssertionError, match="too big"):
                test_toy.test_toy(12)
            assert test_toy.test_toy(3) == "ran"
    """)
    )
    (tmp_path / "toy_checks").symlink_to(checks)
    monkeypatch.setattr(mutation, "CHECKS", checks)
    monkeypatch.setattr(mutation, "PACKAGE", "toy_checks")
    monkeypatch.setattr(mutation, "ROOT", tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(mutation.HERE.parents[1])]))
    node = "tests/unit/test_toy_evidence.py::test_too_big_fails"
    ms = mutation.plan({"test_toy.py::test_toy": (node,)}, checks_dir=checks)
    log = tmp_path / "log"
    outcomes = {}
    for m in ms:
        code = mutation.run_forked(
            m.key,
            [m.module],
            [node, "-p", "no:randomly", "--rootdir", str(tmp_path), "-c", os.devnull],
            log,
            timeout=60,
        )
        outcomes[m.id.split("#")[1]] = code
    assert (
        mutation.run_forked(
            "", ["toy_checks.test_toy"], [node, "--rootdir", str(tmp_path), "-c", os.devnull], log, timeout=60
        )
        == 0
    ), log.read_text()
    assert {k: v != 0 for k, v in outcomes.items()} == {
        "noop": True,
        "negate@test_toy.assert1": True,
        "remove@test_toy.assert1": True,
        "negate@helper.assert1": True,
        "remove@helper.assert1": False,
    }, log.read_text()


def test_a_survivor_needs_a_reason_and_the_share_its_floor(toy):
    ms = mutation.plan({"test_toy.py::test_toy": ("n",)}, checks_dir=toy.parent)
    outcomes = {m.id: mutation.Outcome(m.id, m.site != "helper.assert1") for m in ms}
    rep = mutation.Report(ms, outcomes, {}, floor=0.5)
    assert len(rep.problems()) == 2 and all("gives no reason" in p for p in rep.problems())
    rep.reasons = {"test_toy.py::helper.assert1": {"*": "a helper no evidence here reaches"}}
    assert rep.problems() == [] and rep.share() == 0.6
    rep.floor = 0.95
    assert rep.problems() == ["killed 60.0% of the mutants, under the floor 95%"]
    rep.reasons = {"test_toy.py::test_toy": {"remove@helper.assert1": "r1", "helper.assert1": "r2"}}
    assert [mutation.reason_of(m, rep.reasons) for m in rep.survivors()] == ["r2", "r1"]


# --------------------------------------------------------------------------- the recorded report


@pytest.fixture(scope="module")
def recorded():
    mutants, _ = mutation.current_plan()
    floor, reasons = mutation.load_survivors()
    record = json.loads(mutation.RECORD.read_text())
    return record, mutants, mutation.from_record(record, mutants, reasons, floor)


def test_the_record_covers_every_planned_mutant(recorded):
    record, mutants, _ = recorded
    assert mutation.record_problems(record, mutants) == []


def test_every_survivor_has_a_reason_and_the_share_is_at_its_floor(recorded):
    _, _, rep = recorded
    assert rep.problems() == []


def test_a_hollow_unit_entry_is_not_counted_and_its_check_is_shown_by_a_variant_ci_builds(recorded):
    """A check whose unit evidence survives its no-op counts only by what really fails it."""
    from tests.conformance import failures

    _, _, rep = recorded
    table = failures.build()
    for cid in rep.hollow():
        ways = table.ways_of(cid)
        assert all(w.uncounted.startswith("hollow") for w in ways if w.kind == "unit"), cid
        assert table.primary().get(cid) == "variant", (cid, ways)


def test_the_docs_mutation_report_is_what_the_record_gives(recorded):
    _, _, rep = recorded
    problem = mutation.drift_problem(mutation.DOC.read_text(), mutation.render(rep))
    assert problem is None, problem


def test_a_stale_docs_report_is_named(recorded):
    _, _, rep = recorded
    doc = mutation.DOC.read_text()
    block = mutation.render(rep)
    edited = doc.replace(block, block.replace(" killed (", " killed  ("))
    assert edited != doc
    assert mutation.drift_problem(edited, block).endswith(f"run `{mutation.GENERATOR}`")
    assert "must hold one" in mutation.drift_problem(doc.replace(mutation.END, ""), block)


def test_the_failure_table_reads_the_hollow_checks_from_the_record(tmp_path):
    from tests.conformance import failures

    record = tmp_path / "r.json"
    record.write_text(
        json.dumps(
            {
                "outcomes": {
                    "test_nccl.py::test_nccl_version#noop": {"killed": False},
                    "test_nccl.py::test_one_nccl#noop": {"killed": True},
                }
            }
        )
    )
    assert failures.hollow_checks(record) == {"test_nccl.py::test_nccl_version"}
    table = failures.build(hollow={"test_nccl.py::test_nccl_version"})
    way = next(w for w in table.ways if w.check == "test_nccl.py::test_nccl_version" and w.kind == "unit")
    assert way.uncounted.startswith("hollow")
    assert "hollow: its evidence still passes" in failures.render(table)
