"""Mutation testing of the conformance checks against their unit evidence: is each check's named
evidence able to notice when the check is broken, assert by assert?

For every check with unit evidence (tests/conformance/failures.yaml: ``unit``, plus ``also``, plus
every other test under tests/unit that calls the check by name), these mutants are made:

* ``noop``: the whole check returns at once (it can no longer fail);
* ``negate``: one ``assert T, M`` becomes ``assert not (T), M``;
* ``remove``: one ``assert`` becomes ``pass``;

over the asserts of the check and of the helper functions of its own module it calls (transitively:
``type_mpi`` -> ``outputs`` -> ``check_topology`` in test_azureml.py), which is where a check delegates
its verdict. A mutant is killed when its check's evidence fails (pytest exits non-zero, or runs past
the time limit); a survivor needs a reason in tests/conformance/mutation-survivors.yaml.

Why a harness of its own and not mutmut or cosmic-ray: the mutants needed are few and specific (a
check made a no-op, each assert negated or removed, about 300 in all), and the test to run for each
is known in advance from failures.yaml, one check's unit tests and nothing else. mutmut mutates
every operator and constant of the files it is given (thousands of mutants here, most of them in
code no check's verdict depends on), writes its mutants into a copy of the tree it manages and picks
the tests to run from coverage; cosmic-ray needs a session database, a config per module and runs
the whole test command per mutant. Neither maps a mutant to "this check's named evidence", which is
the question the failure table asks, and neither runs in a few minutes on 2 cores here.

How: "mutant schemata". Each mutated module is compiled once with every mutant in it, each guarded
by ``__tb_mutant__ == KEY`` (the key read from TB_MUTANT at call time), so no file in the tree is
ever written: a meta-path finder serves the schemata module in place of the real one, with the real
``__file__`` (its probes and resources are found as usual) and pytest's own assertion rewriting
applied, so the evidence sees the messages it sees in a normal run. A worker process imports the
heavy third-party modules once and forks one child per mutant, which sets TB_MUTANT and runs
``pytest.main`` on that check's evidence only (``-x``); two workers at most.

Incremental: a check whose evidence reads nothing that changed since the record was written (its
baseline's inputs, tests/conformance/inputs.py) keeps its recorded outcomes and is not re-run;
``--full`` re-runs every check. A run that re-runs some checks says which, and why.

    .venv/bin/python -m tests.conformance.mutation              # run every mutant; write reports/mutation.json
    .venv/bin/python -m tests.conformance.mutation --record     # ... and the record + docs/conformance.md's block
    .venv/bin/python -m tests.conformance.mutation --ci         # run; exit 1 below the floor, on a survivor
                                                                # without a reason or a result unlike the record
    .venv/bin/python -m tests.conformance.mutation --ci --full  # ... re-running every check, recorded or not
    .venv/bin/python -m tests.conformance.mutation --render     # no run: the docs' block from the record
    .venv/bin/python -m tests.conformance.mutation --check      # no run: exit 1 if the docs' block or the
                                                                # record is stale against the plan
    .venv/bin/python -m tests.conformance.mutation --only test_nccl.py::test_nccl_allreduce_gpu
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.conformance import inputs as run_inputs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CHECKS = ROOT / "trainbase_conformance" / "checks"
UNIT = ROOT / "tests" / "unit"
PACKAGE = "trainbase_conformance.checks"
SURVIVORS = HERE / "mutation-survivors.yaml"
RECORD = HERE / "mutation-record.json"
REPORT = ROOT / "reports" / "mutation.json"
DOC = ROOT / "docs" / "conformance.md"
START, END = "<!-- mutation-report:start -->", "<!-- mutation-report:end -->"
GENERATOR = ".venv/bin/python -m tests.conformance.mutation --record"
ENV, MODULES_ENV = "TB_MUTANT", "TB_MUTANT_MODULES"
KINDS = ("noop", "negate", "remove")
TIMEOUT_S = 120
JOBS = 2


@dataclass(frozen=True)
class Mutant:
    """One mutant of one check: ``key`` selects it in the schemata module (TB_MUTANT); ``where`` is
    FILE:LINE of the assert (or the check's def for noop), ``owner`` the function holding it."""

    check: str
    kind: str
    key: str
    where: str
    owner: str
    site: str  # OWNER.assertK (the K-th assert of OWNER), or the check's name for noop: stable under
    text: str  # edits elsewhere in the file, unlike a line number
    evidence: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.check}#{self.kind}" + ("" if self.kind == "noop" else f"@{self.site}")

    @property
    def module(self) -> str:
        return f"{PACKAGE}.{self.check.split('::')[0].removesuffix('.py')}"


@dataclass
class Outcome:
    id: str
    killed: bool
    by: str = ""  # the evidence node that failed, "timeout", or "" (survived)
    seconds: float = 0.0


# --------------------------------------------------------------------------- the plan


def _keyed(path: Path, node: ast.AST, kind: str) -> str:
    return f"{kind}:{path.name}:{node.lineno}:{node.col_offset}"


def _calls(fn: ast.FunctionDef) -> set[str]:
    return {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def owned_functions(tree: ast.Module, check: str) -> list[ast.FunctionDef]:
    """The check's function and the module-level helpers it calls, transitively (not other checks)."""
    funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    seen, todo = [], [check]
    while todo:
        name = todo.pop(0)
        if name in seen or name not in funcs or (name != check and name.startswith("test_")):
            continue
        seen.append(name)
        todo += sorted(_calls(funcs[name]))
    return [funcs[n] for n in seen]


def callers(unit_dir: Path) -> dict[str, list[str]]:
    """Function name -> the unit tests (node ids) that call a function of that name: a check (or a
    helper of a check module) run on fake input, passing or failing (a test that only passes it
    still kills a negated assert)."""
    out: dict[str, list[str]] = {}
    for path in sorted(unit_dir.glob("test_*.py")):
        rel = path.relative_to(unit_dir.parents[1]).as_posix()
        for fn in ast.parse(path.read_text()).body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_")):
                continue
            for n in ast.walk(fn):
                if isinstance(n, ast.Call):
                    name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                    if name and f"{rel}::{fn.name}" not in out.get(name, []):
                        out.setdefault(name, []).append(f"{rel}::{fn.name}")
    return out


def evidence_of(entries: dict[str, dict], found: dict[str, list[str]] | None = None) -> dict[str, tuple[str, ...]]:
    """check -> its unit evidence: ``unit`` and ``also`` of failures.yaml's unit entries, then every
    other unit test that calls the check (``found``: callers(), or none)."""
    found = found or {}
    out = {}
    for cid, e in entries.items():
        if isinstance(e, dict) and e.get("shown_by") == "unit" and isinstance(e.get("unit"), str):
            named = [e["unit"], *[n for n in (e.get("also") or []) if isinstance(n, str)]]
            out[cid] = tuple(dict.fromkeys(named + found.get(cid.split("::")[1], [])))
    return out


def read_sources(evidence: dict[str, tuple[str, ...]], checks_dir: Path = CHECKS) -> dict[str, str]:
    """The text of every check module the plan mutates, read once: the plan and the schemata are
    made from this snapshot, so an edit to the tree during a run cannot make them disagree."""
    return {f: (checks_dir / f).read_text() for f in sorted({cid.split("::")[0] for cid in evidence})}


def plan(
    evidence: dict[str, tuple[str, ...]],
    sources: dict[str, str] | None = None,
    checks_dir: Path = CHECKS,
    found: dict[str, list[str]] | None = None,
) -> list[Mutant]:
    """The mutants of every check of ``evidence``. A helper's assert is also judged by the unit
    tests that call that helper directly (``found``): they drive the verdict the check delegates."""
    sources = read_sources(evidence, checks_dir) if sources is None else sources
    found = found or {}
    mutants, trees = [], {}
    for cid in sorted(evidence):
        file, _, name = cid.partition("::")
        path = checks_dir / file
        tree = trees.setdefault(file, ast.parse(sources[file]))
        src = sources[file].splitlines()
        fns = owned_functions(tree, name)
        if not fns:
            continue
        check = fns[0]
        mutants.append(
            Mutant(
                cid,
                "noop",
                _keyed(path, check, "noop"),
                f"{file}:{check.lineno}",
                name,
                name,
                f"def {name}(...): return",
                evidence[cid],
            )
        )
        for fn in fns:
            asserts = sorted(
                (n for n in ast.walk(fn) if isinstance(n, ast.Assert)), key=lambda n: (n.lineno, n.col_offset)
            )
            ev = (
                evidence[cid]
                if fn is check
                else tuple(
                    dict.fromkeys(
                        evidence[cid] + tuple(n for n in found.get(fn.name, []) if n.startswith("tests/unit/"))
                    )
                )
            )
            for k, a in enumerate(asserts, 1):
                for kind in ("negate", "remove"):
                    mutants.append(
                        Mutant(
                            cid,
                            kind,
                            _keyed(path, a, kind),
                            f"{file}:{a.lineno}",
                            fn.name,
                            f"{fn.name}.assert{k}",
                            src[a.lineno - 1].strip()[:160],
                            ev,
                        )
                    )
    return mutants


# --------------------------------------------------------------------------- the schemata


def _at(new: ast.AST, anchor: ast.AST, shallow: bool = False) -> ast.AST:
    """``new`` (all of it, or only itself when ``shallow``) placed at ``anchor``'s lines."""
    for n in [new] if shallow else ast.walk(new):
        if hasattr(n, "lineno") or isinstance(n, (ast.expr, ast.stmt)):
            for a in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
                setattr(n, a, getattr(anchor, a))
    return new


class Schemata(ast.NodeTransformer):
    """Every assert of the module guarded by its negate/remove keys, every test_* function by its
    noop key; the key is read from the environment at call time (a forked child sets it)."""

    def __init__(self, path: Path):
        self.path = path

    def _is(self, key: str, anchor: ast.AST) -> ast.expr:
        return _at(ast.parse(f"__tb_os__.environ.get({ENV!r}, '') == {key!r}", mode="eval").body, anchor)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        self.generic_visit(node)
        if node.name.startswith("test_"):
            guard = _at(
                ast.If(
                    test=self._is(_keyed(self.path, node, "noop"), node.body[0]),
                    body=[ast.Return(value=None)],
                    orelse=[],
                ),
                node.body[0],
            )
            at = (
                1
                if (
                    node.body
                    and isinstance(node.body[0], ast.Expr)
                    and isinstance(getattr(node.body[0], "value", None), ast.Constant)
                )
                else 0
            )
            node.body.insert(at, guard)
        return node

    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        negated = ast.Assert(test=ast.UnaryOp(op=ast.Not(), operand=node.test), msg=node.msg)
        inner = _at(
            ast.If(test=self._is(_keyed(self.path, node, "remove"), node), body=[_at(ast.Pass(), node)], orelse=[node]),
            node,
            shallow=True,
        )
        for n in (negated, negated.test):
            ast.copy_location(n, node)
        return _at(
            ast.If(test=self._is(_keyed(self.path, node, "negate"), node), body=[negated], orelse=[inner]),
            node,
            shallow=True,
        )


def schemata_code(path: Path, source: bytes):
    """The module at ``path`` (its text ``source``) compiled with all its mutants, pytest's
    assertion rewriting applied."""
    tree = Schemata(path).visit(ast.parse(source, str(path)))
    body = tree.body
    at = 0
    while at < len(body) and (
        isinstance(body[at], ast.ImportFrom)
        and body[at].module == "__future__"
        or at == 0
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
    ):
        at += 1
    body.insert(at, _at(ast.parse("import os as __tb_os__").body[0], body[at] if at < len(body) else body[-1]))
    ast.fix_missing_locations(tree)
    from _pytest.assertion.rewrite import rewrite_asserts

    rewrite_asserts(tree, source, str(path), None)
    return compile(tree, str(path), "exec", dont_inherit=True)


class SchemataFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the named modules from their schemata, with their real ``__file__``; the text is the
    run's snapshot (``snapshot``/FILE) where one is given."""

    def __init__(self, modules: dict[str, Path], snapshot: Path | None = None):
        self.modules, self.snapshot = modules, snapshot

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.modules:
            return None
        return importlib.util.spec_from_file_location(fullname, self.modules[fullname], loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        path = self.modules[module.__name__]
        text = (self.snapshot / path.name if self.snapshot else path).read_bytes()
        exec(schemata_code(path, text), module.__dict__)  # noqa: S102 - the checks' own source, mutated


def install(modules: list[str], snapshot: Path | None = None) -> SchemataFinder:
    finder = SchemataFinder({m: CHECKS / (m.rsplit(".", 1)[1] + ".py") for m in modules}, snapshot)
    sys.meta_path.insert(0, finder)
    return finder


# --------------------------------------------------------------------------- running

PRELOAD = ("pytest", "_pytest.python", "_pytest.assertion.rewrite", "jsonschema", "yaml", "docker", "testinfra")


def _run_child(
    mutant_key: str, modules: list[str], nodes: list[str], log: Path, snapshot: Path | None, track: Path | None = None
) -> int:
    """In a forked child: the schemata modules imported (so pytest's hook never sees them), then the
    evidence run with TB_MUTANT set. Returns pytest's exit code. With ``track``, what the run read
    from the repository is written there (one path per line)."""
    tracker = None
    if track is not None:
        tracker = run_inputs.Tracker(ROOT)
        tracker.start()
    os.environ[ENV] = mutant_key
    fd = os.open(str(log), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), line_buffering=True)
    install(modules, snapshot)
    for m in modules:
        importlib.import_module(m)
    import pytest

    code = int(
        pytest.main(["-x", "-q", "-p", "no:cacheprovider", "--no-header", "-o", "console_output_style=classic", *nodes])
    )
    if tracker is not None and track is not None:
        track.write_text("\n".join(tracker.paths()) + "\n")
    return code


def run_forked(
    mutant_key: str,
    modules: list[str],
    nodes: list[str],
    log: Path,
    snapshot: Path | None = None,
    timeout: int = TIMEOUT_S,
    track: Path | None = None,
) -> int | None:
    """Fork a child for one mutant; its exit code, or None when it ran past ``timeout``."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            os.chdir(ROOT)
            code = _run_child(mutant_key, modules, nodes, log, snapshot, track)
        except BaseException:  # noqa: BLE001 - the child must never return into the worker
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.02)


def worker_main() -> int:
    """A worker: preload, then read one JSON task per line on stdin, answer one JSON line each."""
    sys.path.insert(0, str(ROOT))
    for m in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(m)
    logs = Path(tempfile.mkdtemp(prefix="tb-mutation-"))
    out = sys.stdout
    for line in sys.stdin:
        task = json.loads(line)
        log = logs / "child.log"
        track = logs / "child.inputs" if task.get("track") else None
        if track is not None:
            track.unlink(missing_ok=True)
        t0 = time.monotonic()
        code = run_forked(
            task["key"],
            task["modules"],
            task["nodes"],
            log,
            Path(task["snapshot"]) if task.get("snapshot") else None,
            track=track,
        )
        text = log.read_text(errors="replace") if log.exists() else ""
        read = track.read_text().split() if track is not None and track.exists() else []
        out.write(
            json.dumps(
                {
                    "id": task["id"],
                    "code": code,
                    "seconds": round(time.monotonic() - t0, 2),
                    "failed": _failed_node(text),
                    "tail": text[-1500:],
                    "inputs": read,
                }
            )
            + "\n"
        )
        out.flush()
    return 0


def _failed_node(text: str) -> str:
    for ln in text.splitlines():
        if ln.startswith(("FAILED ", "ERROR ")):
            return ln.split(" ", 1)[1].split(" - ")[0].strip()
    return ""


class Worker:
    def __init__(self):
        import subprocess

        self.p = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from tests.conformance.mutation import worker_main; import sys; sys.exit(worker_main())",
            ],
            cwd=ROOT,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, ENV: ""},
        )

    def ask(self, task: dict) -> dict:
        self.p.stdin.write(json.dumps(task) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def run(
    mutants: list[Mutant], sources: dict[str, str], jobs: int = JOBS, progress=None
) -> tuple[list[Outcome], dict[str, dict], dict[str, list[str]]]:
    """Each check's evidence first on the unmutated schemata (it must pass: else its mutants prove
    nothing), then every mutant, the modules' text taken from ``sources`` (the plan's snapshot,
    written to a temporary folder). Returns the outcomes, the baselines that did not pass, and what
    each check's baseline read from the repository."""
    import queue
    import threading

    snapshot = Path(tempfile.mkdtemp(prefix="tb-mutation-src-"))
    for file, text in sources.items():
        (snapshot / file).write_text(text)
    union: dict[str, dict[str, None]] = {}
    for m in mutants:
        union.setdefault(m.check, {}).update(dict.fromkeys(m.evidence))
    checks = sorted({m.check: (tuple(union[m.check]), m.module) for m in mutants}.items())
    tasks: list[tuple[str, dict]] = [
        (
            "baseline",
            {"id": cid, "key": "", "modules": [mod], "nodes": list(ev), "snapshot": str(snapshot), "track": True},
        )
        for cid, (ev, mod) in checks
    ]
    tasks += [
        (
            "mutant",
            {"id": m.id, "key": m.key, "modules": [m.module], "nodes": list(m.evidence), "snapshot": str(snapshot)},
        )
        for m in mutants
    ]
    q: queue.Queue = queue.Queue()
    for t in tasks:
        q.put(t)
    answers: dict[tuple[str, str], dict] = {}
    lock = threading.Lock()

    def drain():
        w = Worker()
        try:
            while True:
                try:
                    kind, task = q.get_nowait()
                except queue.Empty:
                    return
                a = w.ask(task)
                with lock:
                    answers[kind, task["id"]] = a
                    if progress:
                        progress(len(answers), len(tasks), kind, task["id"], a)
        finally:
            w.close()

    with ThreadPoolExecutor(max(1, min(jobs, JOBS))) as pool:
        for f in [pool.submit(drain) for _ in range(max(1, min(jobs, JOBS)))]:
            f.result()
    broken = {cid: answers["baseline", cid] for cid, _ in checks if answers["baseline", cid]["code"] != 0}
    outcomes = []
    for m in mutants:
        a = answers["mutant", m.id]
        if m.check in broken:
            outcomes.append(Outcome(m.id, False, "", a["seconds"]))
        elif a["code"] is None:
            outcomes.append(Outcome(m.id, True, "timeout", a["seconds"]))
        else:
            outcomes.append(
                Outcome(m.id, a["code"] != 0, (a["failed"] or f"exit {a['code']}") if a["code"] else "", a["seconds"])
            )
    read = {cid: answers["baseline", cid].get("inputs") or [] for cid, _ in checks}
    return outcomes, broken, read


def own_text(check: str, ms: list[Mutant], sources: dict[str, str]) -> str:
    """What of a check the digest covers besides the files its run reads: its module's text (served
    from the plan's snapshot, so the run never opens it), its evidence and its planned mutants."""
    mine = [m for m in ms if m.check == check]
    evidence = sorted({n for m in mine for n in m.evidence})
    return "\n".join([sources[check.split("::")[0]], *evidence, *sorted(m.id for m in mine)])


def unchanged_checks(record: dict, mutants: list[Mutant], sources: dict[str, str]) -> dict[str, dict]:
    """The checks whose recorded inputs still digest to the record's value, with every planned mutant
    recorded: their outcomes stand. Check -> its record entry ({"digest", "files"})."""
    files = record.get("inputs", {}).get("files", [])
    got = record.get("outcomes", {})
    out = {}
    for cid, entry in record.get("inputs", {}).get("checks", {}).items():
        mine = [m for m in mutants if m.check == cid]
        if not mine or any(m.id not in got for m in mine):
            continue
        paths = [files[int(i)] for i in entry["uses"].split(",") if i]
        if run_inputs.digest(ROOT, paths, own_text(cid, mutants, sources)) == entry["digest"]:
            out[cid] = {"digest": entry["digest"], "files": paths}
    return out


def inputs_block(per_check: dict[str, dict]) -> dict:
    """The record's ``inputs``: one sorted list of paths, and per check its digest and the indexes of
    the paths its run read (a comma-joined string, to keep the record short)."""
    files = sorted({p for e in per_check.values() for p in e["files"]})
    index = {p: i for i, p in enumerate(files)}
    return {
        "files": files,
        "checks": {
            cid: {"digest": e["digest"], "uses": ",".join(str(index[p]) for p in sorted(e["files"]))}
            for cid, e in sorted(per_check.items())
        },
    }


# --------------------------------------------------------------------------- survivors, the report


def load_survivors(path: Path = SURVIVORS) -> tuple[float, dict[str, dict[str, str]]]:
    """The floor (the least killed share CI accepts) and the reasons: check -> {KIND@SITE, SITE,
    ``noop`` or ``*`` (every survivor of the check): reason}, and for a helper many checks share, ``FILE::HELPER.assertK`` -> {``*``: reason}
    (its ``helpers`` section)."""
    data = yaml.safe_load(path.read_text()) if path.exists() else {}
    data = data or {}
    reasons = {k: dict(v or {}) for k, v in (data.get("survivors") or {}).items()}
    for site, why in (data.get("helpers") or {}).items():
        reasons.setdefault(site, {})["*"] = why
    return float(data.get("floor", 0.0)), reasons


def reason_of(m: Mutant, reasons: dict[str, dict[str, str]]) -> str:
    """The reason mutation-survivors.yaml gives for a surviving mutant (see load_survivors)."""
    mine = reasons.get(m.check, {})
    shared = reasons.get(f"{m.check.split('::')[0]}::{m.site}", {})
    return (
        mine.get(f"{m.kind}@{m.site}")
        or mine.get(m.site if m.kind != "noop" else "noop")
        or shared.get(f"{m.kind}@*")
        or shared.get("*")
        or mine.get("*")
        or ""
    ).strip()


@dataclass
class Report:
    mutants: list[Mutant]
    outcomes: dict[str, Outcome]
    reasons: dict[str, dict[str, str]]
    floor: float
    broken: dict[str, dict] = field(default_factory=dict)
    seconds: float = 0.0

    def survivors(self) -> list[Mutant]:
        return [m for m in self.mutants if not self.outcomes[m.id].killed]

    def unexplained(self) -> list[Mutant]:
        return [m for m in self.survivors() if not reason_of(m, self.reasons)]

    def share(self) -> float:
        return sum(o.killed for o in self.outcomes.values()) / max(1, len(self.mutants))

    def per_kind(self) -> dict[str, tuple[int, int]]:
        return {
            k: (
                sum(1 for m in self.mutants if m.kind == k and self.outcomes[m.id].killed),
                sum(1 for m in self.mutants if m.kind == k),
            )
            for k in KINDS
        }

    def hollow(self) -> list[str]:
        """Checks whose evidence passes with the check made a no-op."""
        return sorted(m.check for m in self.mutants if m.kind == "noop" and not self.outcomes[m.id].killed)

    def problems(self) -> list[str]:
        out = [
            f"{cid}: its evidence fails on the unmutated check: {b.get('failed') or b.get('tail', '')[-300:]}"
            for cid, b in sorted(self.broken.items())
        ]
        out += [f"{m.id}: survived ({m.text}) and mutation-survivors.yaml gives no reason" for m in self.unexplained()]
        if self.share() < self.floor:
            out.append(f"killed {self.share():.1%} of the mutants, under the floor {self.floor:.0%}")
        return out

    def to_json(self) -> dict:
        checks = {}
        for m in self.mutants:
            o = self.outcomes[m.id]
            c = checks.setdefault(m.check, {"evidence": list(m.evidence), "mutants": 0, "killed": 0, "survived": []})
            c["mutants"] += 1
            c["killed"] += o.killed
            if not o.killed:
                c["survived"].append(
                    {
                        "kind": m.kind,
                        "site": m.site,
                        "where": m.where,
                        "assert": m.text,
                        "reason": reason_of(m, self.reasons),
                    }
                )
        kinds = self.per_kind()
        return {
            "generator": "tests/conformance/mutation.py",
            "seconds": round(self.seconds, 1),
            "mutants": len(self.mutants),
            "killed": sum(o.killed for o in self.outcomes.values()),
            "share_killed": round(self.share(), 4),
            "floor": self.floor,
            "per_kind": {k: {"killed": a, "mutants": b} for k, (a, b) in kinds.items()},
            "checks": checks,
            "outcomes": {
                m.id: {"killed": self.outcomes[m.id].killed, "by": self.outcomes[m.id].by} for m in self.mutants
            },
        }


def from_record(record: dict, mutants: list[Mutant], reasons, floor) -> Report:
    """The recorded outcomes laid over today's plan; a mutant the record lacks counts as survived."""
    got = record.get("outcomes", {})
    outcomes = {
        m.id: Outcome(m.id, bool(got.get(m.id, {}).get("killed")), got.get(m.id, {}).get("by", "")) for m in mutants
    }
    return Report(mutants, outcomes, reasons, floor, seconds=float(record.get("seconds", 0)))


def render(r: Report) -> str:
    """The Markdown block for docs/conformance.md."""
    # sites by function and ordinal, never by line: an edit elsewhere in a check file leaves this as it is
    rows = ["| check | mutants | killed | survived (kind @ function.assertK: reason) |", "|---|---|---|---|"]
    by_check: dict[str, list[Mutant]] = {}
    for m in r.mutants:
        by_check.setdefault(m.check, []).append(m)
    for cid, ms in sorted(by_check.items()):
        killed = sum(r.outcomes[m.id].killed for m in ms)
        surv = [m for m in ms if not r.outcomes[m.id].killed]
        cell = (
            "; ".join(
                f"{m.kind} @ `{m.site}`: {' '.join(reason_of(m, r.reasons).split()) or 'NO REASON'}".replace("|", "\\|")
                for m in surv
            )
            or "—"
        )
        rows.append(f"| `{cid}` | {len(ms)} | {killed} | {cell} |")
    kinds = r.per_kind()
    total_killed = sum(o.killed for o in r.outcomes.values())
    hollow = r.hollow()
    return "\n".join(
        [
            START,
            f"<!-- written by `{GENERATOR}` from its run (tests/conformance/mutation-record.json) and the reasons in "
            "tests/conformance/mutation-survivors.yaml: edit those, not this -->",
            "",
            *rows,
            "",
            f"{len(by_check)} checks with unit evidence, {len(r.mutants)} mutants: {total_killed} killed "
            f"({r.share():.1%}; the floor is {r.floor:.0%}); by kind: "
            + ", ".join(f"{k} {a} of {b}" for k, (a, b) in kinds.items())
            + f". {len(r.survivors())} survive, each with its reason. Run time of the last recorded run: "
            f"{r.seconds:.0f} s ({JOBS} workers).",
            "",
            (
                "Checks whose evidence passes with the check made a no-op (hollow): "
                + ", ".join(f"`{c}`" for c in hollow)
                if hollow
                else "No check's evidence passes with the check made a no-op."
            ),
            END,
        ]
    )


def splice(doc_text: str, block: str) -> str:
    if doc_text.count(START) == 1 and doc_text.count(END) == 1:
        a, b = doc_text.index(START), doc_text.index(END) + len(END)
        return doc_text[:a] + block + doc_text[b:]
    raise ValueError(f"docs/conformance.md must hold one {START} ... {END} block")


def drift_problem(doc_text: str, block: str) -> str | None:
    try:
        if splice(doc_text, block) == doc_text:
            return None
    except ValueError as e:
        return str(e)
    return f"the mutation report in docs/conformance.md is not what the record gives: run `{GENERATOR}`"


def record_problems(record: dict, mutants: list[Mutant]) -> list[str]:
    """Where the record no longer covers the plan (a check or an assert added, moved or removed)."""
    got, want = set(record.get("outcomes", {})), {m.id for m in mutants}
    out = []
    if want - got:
        out.append(
            f"{len(want - got)} planned mutant(s) not in the record, e.g. {sorted(want - got)[0]}: run `{GENERATOR}`"
        )
    if got - want:
        out.append(
            f"{len(got - want)} recorded mutant(s) no longer planned, e.g. {sorted(got - want)[0]}: run `{GENERATOR}`"
        )
    return out


def current_plan() -> tuple[list[Mutant], dict[str, str]]:
    from tests.conformance import failures

    found = callers(UNIT)
    evidence = evidence_of(failures.load_entries(), found)
    sources = read_sources(evidence)
    return plan(evidence, sources, found=found), sources


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.conformance.mutation", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--ci",
        action="store_true",
        help="exit 1 below the floor, on a survivor without a reason, or on a result other than the record's",
    )
    ap.add_argument("--record", action="store_true", help="write the record and docs/conformance.md's block")
    ap.add_argument("--check", action="store_true", help="no run: exit 1 if the record or the docs' block is stale")
    ap.add_argument(
        "--render",
        action="store_true",
        help="no run: write docs/conformance.md's block from the record (after editing mutation-survivors.yaml)",
    )
    ap.add_argument("--only", action="append", default=[], help="run only this check (FILE::FUNCTION), repeatable")
    ap.add_argument("--jobs", type=int, default=JOBS, help=f"worker processes (at most {JOBS})")
    ap.add_argument(
        "--full",
        action="store_true",
        help="re-run every check, also those whose inputs are unchanged since the record",
    )
    a = ap.parse_args(argv)
    mutants, sources = current_plan()
    floor, reasons = load_survivors()
    if a.render:
        rep = from_record(json.loads(RECORD.read_text()), mutants, reasons, floor)
        DOC.write_text(splice(DOC.read_text(), render(rep)))
        print(f"wrote {DOC.relative_to(ROOT)}'s block: {len(rep.unexplained())} survivor(s) without a reason")
        return 0
    if a.check:
        record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
        rep = from_record(record, mutants, reasons, floor)
        problems = record_problems(record, mutants) + rep.problems()
        if d := drift_problem(DOC.read_text(), render(rep)):
            problems.append(d)
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    if a.only:
        mutants = [m for m in mutants if m.check in a.only]
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    # incremental: a check whose evidence reads what it read when the record was written keeps its
    # recorded outcomes (tests/conformance/inputs.py); --full, --only and a missing record re-run all
    kept = {} if (a.full or a.only) else unchanged_checks(record, mutants, sources)
    planned = mutants
    mutants = [m for m in planned if m.check not in kept]
    rerun = sorted({m.check for m in mutants})
    if kept:
        print(
            f"{len(kept)} of {len(kept) + len(rerun)} checks keep their recorded outcomes (what their evidence "
            f"reads is unchanged since the record; --full re-runs them); re-running {len(rerun)}"
            + (f": {', '.join(rerun[:8])}{' ...' if len(rerun) > 8 else ''}" if rerun else ""),
            flush=True,
        )
    t0 = time.monotonic()

    def progress(i, n, kind, tid, ans):
        if kind == "baseline" and ans["code"] != 0:
            print(f"[{i}/{n}] baseline of {tid} FAILS: {ans['failed']}\n{ans['tail'][-800:]}", flush=True)
        elif i % 25 == 0 or i == n:
            print(f"[{i}/{n}] {time.monotonic() - t0:.0f} s", flush=True)

    outcomes, broken, read = run(mutants, sources, a.jobs, progress) if mutants else ([], {}, {})
    got = record.get("outcomes", {})
    outcomes += [Outcome(m.id, bool(got[m.id]["killed"]), got[m.id].get("by", "")) for m in planned if m.check in kept]
    mutants = planned
    seen = {
        cid: {"files": files, "digest": run_inputs.digest(ROOT, files, own_text(cid, mutants, sources))}
        for cid, files in read.items()
        if cid not in broken
    }
    rep = Report(mutants, {o.id: o for o in outcomes}, reasons, floor, broken, time.monotonic() - t0)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    data = rep.to_json()
    REPORT.write_text(json.dumps(data, indent=1) + "\n")
    kinds = rep.per_kind()
    print(
        f"{len(mutants)} mutants of {len({m.check for m in mutants})} checks: "
        f"{sum(o.killed for o in outcomes)} killed ({rep.share():.1%}), "
        + ", ".join(f"{k} {x}/{y}" for k, (x, y) in kinds.items())
        + f"; {rep.seconds:.0f} s; wrote {REPORT.relative_to(ROOT)}"
    )
    for m in rep.survivors():
        print(f"  survived {m.id}: {m.text}  -- {reason_of(m, reasons) or 'NO REASON'}")
    if a.record and not a.only:
        # a kept check's recorded seconds and inputs stand; the run's time is that of a full run only
        seconds = data["seconds"] if not kept else record.get("seconds", data["seconds"])
        rep.seconds = seconds  # the docs' block gives the record's run time
        RECORD.write_text(
            json.dumps(
                {
                    **{k: data[k] for k in ("mutants", "killed", "share_killed", "outcomes")},
                    "seconds": seconds,
                    "inputs": inputs_block({**kept, **seen}),
                },
                indent=1,
                sort_keys=True,
            )
            + "\n"
        )
        text = DOC.read_text()
        new = splice(text, render(rep))
        if new != text:
            DOC.write_text(new)
        print(f"wrote {RECORD.relative_to(ROOT)} and {DOC.relative_to(ROOT)}'s block")
    problems = rep.problems()
    if a.ci and not a.only:
        problems += record_problems(record, mutants)
        was = record.get("outcomes", {})
        changed = [m.id for m in mutants if m.id in was and bool(was[m.id].get("killed")) != rep.outcomes[m.id].killed]
        if changed:
            problems.append(
                f"{len(changed)} mutant(s) whose fate differs from the record, e.g. {changed[0]} "
                f"(now {'killed' if rep.outcomes[changed[0]].killed else 'survived'}): run `{GENERATOR}`"
            )
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if (a.ci and problems) else 0


if __name__ == "__main__":
    sys.exit(main())
