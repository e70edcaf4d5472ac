"""The user docs under test: README.md, docs/*.md, examples/README.md and the READMEs the
conformance wheel ships (every *.md outside tests/).

Six checkers, each a pure function (a document's text -> the problems in it):

1. `command_problems`: every option a doc shows for `build.py`, `trainbase-conformance`,
   `tb-launch`, `tb-doctor` or a pytest run of the suite is an option of that command's own
   argument parser (built here, not read from the source; for build.py, the parser of the
   subcommand it names, `build.py render`, or of the one its old action flag stands for,
   `build.py --list`), and the `--profile`, `--select` and `explain` values it names exist in
   matrix.yaml; an option shown on its own (`--select`) must belong to one of those commands
   or be a flag of another tool the docs explain (EXTERNAL_FLAGS).
2. `path_problems`: every relative Markdown link, and every repository path a doc names
   (`scripts/foo.sh`, `docs/x.md`, `locks/*.txt`), exists in the repository.
3. `figure_problems`: counts the docs state in a sentence (cells and images of the `local` and
   `ci` profiles, arm64 cells, the whole matrix, the conformance tiers) equal what the code
   computes.
4. `internal_word_problems`: no words of how this repository was developed (INTERNAL_WORDS).
5. `install_problems`: a doc that installs the conformance suite shows the commands `.ci/run`
   runs: scripts/installed-suite.sh reads them from README.md's block marked
   `<!-- installed-suite.sh: install -->` and runs them as they are; every doc (and gpu.yml)
   must show the same commands, all of them, and none that pip refuses (`--require-hashes` with
   a wheel that has no hash) or leaves unchecked (a wheel without `--no-deps`).
6. `interpreter_problems`: `python build.py` / `python -m pytest|trainbase.*` only where the
   page says which Python has the dependencies (`.venv/bin/python`, or `source
   .venv/bin/activate` / `pip install -r requirements*.txt` once on the page).

And one check of README.md's `## CLI` section (`cli_reference_problems`), per command of
build.py (one subcommand per action, trainbase/cli/parser.py): every command has a row there,
every option a command reads has a row naming that command, no row names a command that does not
read its option, every choice value and `--select` key is named, and every old action flag
(`--render`, trainbase/cli/legacy.py) has a row naming its command.

Each checker is run over the real docs (no problems allowed) and over a planted defect (the
problem must be reported)."""

from __future__ import annotations

import argparse
import fnmatch
import functools
import importlib
import importlib.util
import inspect
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from trainbase.render.figures import as_read, excluded_example

from .conftest import ROOT

# --------------------------------------------------------------------------- the documents

NOT_USER_DOCS = {"tests", ".git", ".venv", ".pytest_cache", "reports", "logs", "node_modules"}


def user_docs() -> list[Path]:
    """Every Markdown file a user reads: all *.md of the checkout but tests/ and generated dirs."""
    found = []
    for top in ROOT.iterdir():
        if top.name in NOT_USER_DOCS:
            continue
        if top.is_dir():
            found += top.rglob("*.md")
        elif top.suffix == ".md":
            found.append(top)
    return sorted(found)


@dataclass(frozen=True)
class Problem:
    doc: str  # repository-relative path
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.what}"


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.M | re.S)
INLINE = re.compile(r"(?<!`)(`{1,2})(?!`)(.+?)(?<!`)\1(?!`)", re.S)


def code_blocks(text: str) -> list[tuple[int, str]]:
    """Fenced code blocks: (offset of the body in text, body)."""
    return [(m.start(2), m.group(2)) for m in FENCE.finditer(text)]


def blank(text: str, spans) -> str:
    """text with each (start, end) span replaced by spaces, newlines kept: same offsets."""
    chars = list(text)
    for start, end in spans:
        for i in range(start, end):
            if chars[i] != "\n":
                chars[i] = " "
    return "".join(chars)


def prose(text: str) -> str:
    """text without its fenced code blocks (same offsets and line numbers)."""
    return blank(text, [(m.start(), m.end()) for m in FENCE.finditer(text)])


def inline_code(text: str) -> list[tuple[int, str]]:
    """Inline code spans outside fenced blocks: (offset of the content, content on one line)."""
    return [
        (m.start(2), m.group(2).replace("\n", " ")) for m in INLINE.finditer(prose(text)) if "\n\n" not in m.group(2)
    ]


def indented_code(text: str) -> list[tuple[int, str]]:
    """Lines of indented (4 spaces) code blocks: a paragraph whose lines all start with 4 spaces."""
    out, offset = [], 0
    lines = prose(text).split("\n")
    for i, line in enumerate(lines):
        if (
            line.startswith("    ")
            and line.strip()
            and not line.lstrip().startswith(("-", "*", "|"))
            and (i == 0 or not lines[i - 1].strip() or lines[i - 1].startswith("    "))
        ):
            out.append((offset, line))
        offset += len(line) + 1
    return out


# --------------------------------------------------------------------------- 1. commands


@dataclass(frozen=True)
class Tool:
    name: str
    options: frozenset[str]
    takes_value: frozenset[str] = frozenset()
    # tb-launch: its own options come first, the first other word is the command it runs
    options_end_at_command: bool = False


def argparse_tool(name: str, ap: argparse.ArgumentParser, *, extra=(), options_end_at_command=False) -> Tool:
    opts = {s for a in ap._actions for s in a.option_strings}
    valued = {s for a in ap._actions for s in a.option_strings if a.nargs not in (0, "?")}
    return Tool(name, frozenset(opts | set(extra)), frozenset(valued), options_end_at_command)


def parser_of(main) -> argparse.ArgumentParser:
    """The parser a main() builds inside itself (tb-launch, the bench scripts): stopped where it
    parses."""

    class Parsed(Exception):
        pass

    def stop(self, *args, **kwargs):
        raise Parsed(self)

    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", stop),
        mock.patch.object(argparse.ArgumentParser, "parse_known_args", stop),
    ):
        try:
            main([]) if inspect.signature(main).parameters else main()
        except Parsed as e:
            return e.args[0]
    raise AssertionError(f"{main} returned without parsing a command line")


IMAGE_LIB = ROOT / "imagefs" / "opt" / "trainbase" / "lib"


def import_module_at(module: str, path: Path | None = None):
    """A module of the image toolbox (or a script), imported without leaving bytecode in
    imagefs/ (it would be copied into images)."""
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    if str(IMAGE_LIB) not in sys.path:
        sys.path.insert(0, str(IMAGE_LIB))
    try:
        if path is None:
            return importlib.import_module(module)
        spec = importlib.util.spec_from_file_location(module, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[module] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.dont_write_bytecode = before


@functools.cache
def pytest_options() -> frozenset[str]:
    """pytest's own options, its installed plugins' (testinfra), and the suite plugin's."""
    from _pytest.config import get_config

    config = get_config()
    config.pluginmanager.load_setuptools_entrypoints("pytest11")
    config.pluginmanager.import_plugin("trainbase_conformance.plugin")
    groups = [config._parser._anonymous, *config._parser._groups]
    return frozenset(name for g in groups for o in g.options for name in o.names())


@functools.cache
def suite_plugin_options() -> frozenset[str]:
    """The options the suite's plugin adds (trainbase_conformance/options.py), asked of it."""
    from trainbase_conformance import options

    names = []

    class Group:
        def addoption(self, *opts, **kwargs):
            names.extend(opts)

    class Parser:
        def getgroup(self, *args, **kwargs):
            return Group()

        def addoption(self, *opts, **kwargs):
            names.extend(opts)

    options.pytest_addoption(Parser())
    return frozenset(names)


def build_py_tools() -> dict[str, Tool]:
    """build.py as the docs may show it: ``build.py SUBCOMMAND`` (each its own Tool, named
    "build.py SUBCOMMAND", with only the options that subcommand reads), and ``build.py`` before
    a subcommand, which takes the old action flags (``--matrix``, ``--list``: legacy.py) and,
    for a line that uses one, every option (the old flag's subcommand then checks them)."""
    from trainbase.cli import legacy
    from trainbase.cli.parser import parser, subparsers

    subs = {f"build.py {name}": argparse_tool(f"build.py {name}", sp) for name, sp in subparsers(parser()).items()}
    every = set().union(*(t.options for t in subs.values()))
    valued = {flag for flag, old in legacy.OLD_FLAGS.items() if old.value == "1"}
    return {
        "build.py": Tool(
            "build.py", frozenset(every | set(legacy.OLD_FLAGS) | set(subparsers(parser()))), frozenset(valued)
        ),
        **subs,
    }


@functools.cache
def tools() -> dict[str, Tool]:
    from trainbase_conformance import cli as suite_cli

    launch = import_module_at("_docs_trainbase_launch", IMAGE_LIB / "trainbase_launch.py")
    doctor_cli = import_module_at("trainbase_doctor.cli")
    # the suite plugin's options must be among pytest's: the command hands them over by name
    assert suite_plugin_options() <= pytest_options()
    bench = {
        path.name: argparse_tool(path.name, parser_of(import_module_at(f"_docs_bench_{path.stem}", path).main))
        for path in sorted((ROOT / "bench").glob("*.py"))
        if "argparse" in path.read_text()
    }
    return {
        **bench,  # bench/*.py: the measurements the docs quote say how to reproduce them
        **build_py_tools(),
        # anything trainbase-conformance does not know goes to pytest (with the suite's plugin)
        "trainbase-conformance": argparse_tool("trainbase-conformance", suite_cli.parser(), extra=pytest_options()),
        "tb-launch": argparse_tool("tb-launch", parser_of(launch.main), options_end_at_command=True),
        "tb-doctor": argparse_tool("tb-doctor", doctor_cli.parser()),
        "pytest": Tool("pytest", pytest_options()),
    }


# Flags of other programs that the docs show on their own in inline code (`--gpus all`): a flag
# shown alone must be one of these or an option of one of `tools()`.
EXTERNAL_FLAGS = frozenset(
    {
        # docker run / build / network / image, buildx
        "--gpus",
        "--shm-size",
        "--ipc",
        "--device",
        "--cap-add",
        "--ulimit",
        "--network",
        "--init",
        "--platform",
        "--read-only",
        "--tmpfs",
        "--user",
        "--privileged",
        "--security-opt",
        "--rm",
        "--mount",
        "--secret",
        "--build-arg",
        "--runtime",
        "--internal",
        "--cache-to",
        "--cache-from",
        "--driver",
        "--load",
        # mpirun / mpiexec, Open MPI's configure, srun and pyxis
        "--mca",
        "--allow-run-as-root",
        "--bind-to",
        "--map-by",
        "--mpi",
        "--ntasks-per-node",
        "--container-image",
        "--container-env",
        "--container-mounts",
        "--enable-orterun-prefix-by-default",
        "--enable-prte-prefix-by-default",
        # Open MPI's and UCX's configure (docs/cuda-aware-mpi.md: how each row is built)
        "--with-cuda",
        "--with-gdrcopy",
        "--without-cuda",
        "--with-cuda-libdir",
        "--disable-dlopen",
        "--without-verbs",
        "--without-rdmacm",
        # Charliecloud, Apptainer, enroot, Podman
        "--set-env",
        "--join",
        "--cleanenv",
        "--sharens",
        "--userns",
        "--writable-tmpfs",
        "--nv",
        "--bind",
        # pip, az / pip private sources, zizmor
        "--require-hashes",
        "--no-deps",
        "--only-binary",
        "--username",
        "--password",
        "--offline",
        # skopeo, ctr, ctr-remote
        "--all",
        "--preserve-digests",
        "--dest-compress-format",
        "--format",
        # nccl-tests' benchmarks (all_reduce_perf ..., docs/choose.md): GPUs per process, sizes, factor
        "-g",
        "-b",
        "-e",
        "-f",
        "-N",
        # torchrun, and the examples' own scripts (examples/*.py)
        "--master-addr",
        "--master-port",
        "--nnodes",
        "--nproc-per-node",
        "--workers",
        "--devices",
        "--num-nodes",
    }
)

SEGMENT_END = re.compile(r"\s(?:\|\|?|&&|;)\s|\s#\s|\s#$|\$\(|`")
TOKEN_EDGES = re.compile(r"^[\"'\[(]+|[\"'\]),;]+$")
FLAG = re.compile(r"--?[A-Za-z][\w-]*")


def clean(token: str) -> str:
    return TOKEN_EDGES.sub("", token)


def flag_of(token: str) -> str | None:
    """`--select=x` -> --select, `[--json]` -> --json, `-ra` -> -r; None for other words."""
    tok = clean(token)
    m = FLAG.match(tok)
    if not m or tok in ("-", "--"):
        return None
    flag = m.group(0)
    return flag if flag.startswith("--") else flag[:2]


def bare_flag(token: str) -> str | None:
    """A flag shown without its command: `--select`, `-j`; not `-arm64` (a name's suffix)."""
    flag = flag_of(token)
    return flag if flag and (flag.startswith("--") or len(clean(token).split("=")[0]) == 2) else None


@dataclass(frozen=True)
class Use:
    tool: str
    flag: str
    value: str  # the next word ('' at the end)
    offset: int  # where the flag is in the document


def command_uses(line: str, offset: int, tool: str | None = None) -> tuple[list[Use], str | None]:
    """The options a shell line passes to the commands of `tools()`, and the command still
    taking options at the line's end (for a continued line). `tool` continues a previous line."""
    uses = []
    known = tools()
    pos = 0
    segments = SEGMENT_END.split(line)
    for n, segment in enumerate(segments):
        start = line.index(segment, pos)
        pos = start + len(segment)
        words = [(m.start() + start, m.group()) for m in re.finditer(r"\S+", segment)]
        skip = 0
        for i, (at, word) in enumerate(words):
            if skip:
                skip -= 1
                continue
            base = clean(word).rsplit("/", 1)[-1]
            nxt = clean(words[i + 1][1]) if i + 1 < len(words) else ""
            if base in known:
                tool = base
                continue
            if word == "-m" and nxt == "pytest":
                tool, skip = "pytest", 1
                continue
            if tool is None:
                continue
            if tool == "build.py" and (sub := build_py_subcommand(word)):
                if flag := flag_of(word):  # an old action flag: its value (--explain NAME) is checked
                    uses.append(Use(tool, flag, nxt if "=" not in word else clean(word).split("=", 1)[1], offset + at))
                    skip = 1 if flag in known[tool].takes_value and "=" not in word else 0
                elif sub == "explain":  # `build.py explain NAME`: the NAME is checked
                    uses.append(Use(tool, "explain", nxt, offset + at))
                tool = f"build.py {sub}"  # the options after it are the subcommand's
                continue
            if clean(word) == "--":
                tool = None if known[tool].options_end_at_command else tool
                continue
            flag = flag_of(word)
            if flag is None:
                if known[tool].options_end_at_command and not re.fullmatch(r"[A-Z.]+", clean(word)):
                    tool = None  # the command tb-launch runs: its options are its own
                continue
            uses.append(Use(tool, flag, nxt if "=" not in word else clean(word).split("=", 1)[1], offset + at))
            if flag in known[tool].takes_value and "=" not in word:
                skip = 1
        if n < len(segments) - 1:
            tool = None  # a pipe, `&&`, `;` or a comment ends the command
    return uses, tool


def command_lines(text: str) -> list[tuple[int, str, bool | None]]:
    """(offset, line, continues the previous line) for every code line; (offset, span, None) for
    every inline code span."""
    out = []
    for start, body in code_blocks(text):
        offset, previous = start, ""
        for line in body.split("\n"):
            cont = previous.rstrip().endswith("\\") or bool(re.match(r"\s+[\[-]", line))
            out.append((offset, line.rstrip("\\"), cont))
            offset += len(line) + 1
            previous = line
    out += [(at, line, False) for at, line in indented_code(text)]
    out += [(at, span, None) for at, span in inline_code(text)]
    return out


def build_py_subcommand(word: str) -> str | None:
    """The subcommand a word after ``build.py`` selects: its name, or an old flag's (``--list``)."""
    from trainbase.cli import legacy

    w = clean(word)
    if f"build.py {w}" in tools():
        return w
    old = legacy.OLD_FLAGS.get(w.split("=", 1)[0])
    return old.command if old else None


def matrix_values() -> tuple[set[str], dict[str, set[str]], set[str]]:
    from trainbase.define.schema import AXES

    m = matrix()
    return set(m.spec.profiles), {a: set(getattr(m.spec.axes, a)) for a in AXES}, {c.name for c in m.included}


def placeholder(value: str) -> bool:
    """NAME, KEY=VALUE, <cell>, ...: a value the reader fills in."""
    return not value or bool(re.search(r"[A-Z]{2,}|[<>{}$]|\.\.\.|…", value))


def value_problems(use: Use) -> str | None:
    """A --profile / --select / explain value of build.py that matrix.yaml does not declare."""
    if use.tool.split(" ")[0] != "build.py" or placeholder(use.value):
        return None
    from trainbase.cli import cells as build_cells

    profiles, axes, included = matrix_values()
    if use.flag == "--profile" and use.value not in profiles:
        return f"build.py --profile {use.value}: no such profile (matrix.yaml: {', '.join(sorted(profiles))})"
    if use.flag in ("--explain", "explain") and build_cells.find(matrix(), use.value) is None:
        return f"build.py {use.flag} {use.value}: no such cell, included or excluded"
    if use.flag == "--select":
        key, _, values = use.value.partition("=")
        if key != "name" and key not in axes:
            return f"build.py --select {use.value}: unknown key {key!r} (axes: {', '.join(axes)}, name)"
        for v in values.split(","):
            if v and (key == "name" and v not in included or key != "name" and v not in axes[key]):
                return f"build.py --select {use.value}: {key} {v!r} is not declared"
    return None


def command_problems(text: str, doc: str = "<doc>") -> list[Problem]:
    """Options and values the docs show that the commands do not take."""
    known = tools()
    everyone = set().union(*(t.options for t in known.values())) | EXTERNAL_FLAGS
    problems = []
    tool = None
    for offset, line, cont in command_lines(text):
        uses, tool = command_uses(line, offset, tool if cont else None)
        if cont is None:
            tool = None  # an inline span continues nothing
        for u in uses:
            if u.flag not in known[u.tool].options:
                problems.append(Problem(doc, line_of(text, u.offset), f"{u.tool} has no option {u.flag}"))
            elif why := value_problems(u):
                problems.append(Problem(doc, line_of(text, u.offset), why))
        # an option shown on its own (`--select`, `--promote --registry R`): whose, the docs say
        # in prose; it must at least belong to one of the commands or to a tool the docs use
        if cont is None and not uses and line.split() and bare_flag(line.split()[0]):
            for m in re.finditer(r"\S+", line):
                flag = bare_flag(m.group())
                if flag and flag not in everyone:
                    problems.append(
                        Problem(
                            doc,
                            line_of(text, offset + m.start()),
                            f"{flag}: no documented command takes it (tools(), EXTERNAL_FLAGS)",
                        )
                    )
    return problems


# --------------------------------------------------------------------------- 2. paths

# Top-level folders that a checkout has only after running something (the image's own paths are
# absolute and never checked).
GENERATED = {"reports", "logs", ".venv"}
# Names that look like repository paths and are not (yet) one, each with why.
NOT_REPOSITORY_PATHS = {
    "locks/security-rebuilds.json": "written by the security check the day a row has a pending fix",
    "trainbase/refresh": "the branch the refresh workflow pushes",
}
LINK = re.compile(r"\[(?:[^\]\n]|\n(?!\n))*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
PATH_TOKEN = re.compile(r"[\w.][\w./*<>{}@+~-]*/[\w./*<>{}@+~-]*")
FILE_SUFFIXES = (".md", ".py", ".sh", ".json", ".yaml", ".yml", ".txt", ".toml", ".lock", ".j2", ".patch")


def top_level() -> set[str]:
    return {p.name for p in ROOT.iterdir()} - GENERATED - {".git", ".pytest_cache"}


def exists(base: Path, rel: str) -> bool:
    """rel under base; placeholder components (<cell>, CELL, ...) end the check, globs must match."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    here = base
    for i, part in enumerate(parts):
        if re.search(r"[<>{}$]|\.\.\.", part) or re.fullmatch(r"[A-Z][A-Z0-9_-]+", part):
            return here.exists()
        if any(c in part for c in "*?["):
            return any(True for _ in here.glob("/".join(parts[i:])))
        here = here / part
    return here.exists()


def path_candidates(chunk: str, offset: int, suffix_only: bool) -> list[tuple[int, str]]:
    """Words of chunk that look like repository paths: `dir/...`; in prose, only `dir/file.ext`."""
    out = []
    for m in PATH_TOKEN.finditer(chunk):
        token = m.group().rstrip(".,;")
        before, after = chunk[max(0, m.start() - 1) : m.start()], chunk[m.end() : m.end() + 12]
        if after.startswith("://") or before in ("/", "@", "$", "~", "#", ":", "."):
            continue  # a URL, an absolute or home path, a registry's image
        if after.startswith(":") and not after.startswith("::") and not re.match(r":\d+(?![\w.-])", after):
            continue  # an image reference: trainbase/CELL:TAG
        if "@" in token:
            continue  # trainbase/CELL@sha256:...
        if suffix_only and not token.endswith(FILE_SUFFIXES):
            continue
        out.append((offset + m.start(), token))
    return out


def path_problems(text: str, doc: str = "README.md") -> list[Problem]:
    """Broken relative links, and repository paths named in code or prose that do not exist."""
    here = (ROOT / doc).parent
    problems = []
    for m in LINK.finditer(prose(text)):
        target = m.group(1).split("#", 1)[0]
        if not target or re.match(r"[a-z][a-z+.-]*:", target):
            continue  # an anchor in the page, or https:, mailto:
        resolved = (here / target).resolve()
        if not resolved.is_relative_to(ROOT):
            problems.append(Problem(doc, line_of(text, m.start()), f"link to {target}: outside the repository"))
        elif not resolved.exists():
            problems.append(Problem(doc, line_of(text, m.start()), f"link to {target}: no such file"))
    tops = top_level()
    chunks = [(at, body, False) for at, body in code_blocks(text)]
    chunks += [(at, span, False) for at, span in inline_code(text)]
    plain = blank(
        prose(text),
        [(at, at + len(s)) for at, s in inline_code(text)] + [m.span(1) for m in LINK.finditer(prose(text))],
    )  # links: checked above
    chunks.append((0, plain, True))
    for at, chunk, suffix_only in chunks:
        for pos, candidate in path_candidates(chunk, at, suffix_only):
            token = candidate
            if token.startswith("./"):
                token = token[2:]  # relative to where the reader stands: the checkout's root
                if token.split("/", 1)[0] not in tops:
                    continue
            first = token.split("/", 1)[0]
            if first in GENERATED or token.rstrip("/") in NOT_REPOSITORY_PATHS:
                continue
            if token.startswith("../"):
                if not (here / token).resolve().is_relative_to(ROOT):
                    problems.append(Problem(doc, line_of(text, pos), f"{token}: outside the repository"))
                elif not exists(here, token):
                    problems.append(Problem(doc, line_of(text, pos), f"{token}: no such path"))
            elif first in tops:
                if not exists(ROOT, token):
                    problems.append(Problem(doc, line_of(text, pos), f"{token}: no such path in the repository"))
            elif here != ROOT and (here / first).exists() and not exists(here, token):
                problems.append(Problem(doc, line_of(text, pos), f"{token}: no such path next to {doc}"))
    return problems


# --------------------------------------------------------------------------- 3. figures


@functools.cache
def matrix():
    from trainbase.define.matrix import load

    return load(ROOT / "matrix.yaml")


@functools.cache
def figures() -> dict[str, int]:
    """What the code says: the matrix's counts, each profile's cells and images (the cells plus
    the parents their builds need), and the conformance tiers."""
    from trainbase_conformance import TIERS

    m = matrix()
    out = {
        "cells": len(m.included),
        "excluded": len(m.cells) - len(m.included),
        "platforms": len(m.spec.axes.platform),
        "tiers": len(TIERS),
    }
    for platform in m.spec.axes.platform:
        out[platform.rsplit("/", 1)[-1]] = sum(1 for c in m.included if c.platform == platform)
    for profile in ("local", "ci"):
        cells = m.select(profile=profile)
        images, todo = {}, list(cells)
        while todo:
            c = todo.pop()
            images[c.name] = c
            if c.parent and c.parent not in images:
                todo.append(m.cell(c.parent))
        for noun, group in (("cells", cells), ("images", list(images.values()))):
            out[f"{profile}_{noun}"] = len(group)
            out[f"{profile}_base_{noun}"] = sum(1 for c in group if not c.parent)
            for arch in ("amd64", "arm64"):
                out[f"{profile}_{arch}_{noun}"] = sum(1 for c in group if c.arch == arch)
    return out


NUMBER_WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]
N = r"\d+|" + "|".join(NUMBER_WORDS)


def _profile_patterns() -> list[str]:
    pats = []
    for prof in ("local", "ci"):
        p = rf"`?{prof}`?"
        pats.append(
            rf"\b{p}\s+profile\s+(?:has|selects)\s+(?P<{prof}_cells>{N})\s+cells\s+and\s+"
            rf"(?P<{prof}_images>{N})\s+images\b"
        )  # has 14 cells and 15 images
        for noun in ("cells", "images"):
            for kind, words in (("", ""), ("base_", r"base\s+"), ("amd64_", r"amd64\s+"), ("arm64_", r"arm64\s+")):
                g = rf"(?P<{prof}_{kind}{noun}>{N})"
                pats += [
                    rf"\b{g}\s+{words}{noun}\s+(?:of|in)\s+the\s+{p}\s+profile\b",  # 14 cells of the local profile
                    rf"\b{p}\s+(?:profile|part),\s+{g}\s+{words}{noun}\b",  # the `ci` part, 3 base cells
                    rf"\b{p}\s+profile's\s+{g}\s+{words}{noun}\b",  # the local profile's 2 arm64 cells
                    rf"\bthe\s+{g}\s+{p}\s+{words}{noun}\b",  # the 9 local images
                    rf"\b{p}\s+profile\s+(?:has|builds|selects)\s+{g}\s+{words}{noun}\b",
                ]
    return pats


# Sentences stating a figure; each named group is a key of figures().
FIGURE_PATTERNS = [
    re.compile(p, re.I)
    for p in [
        rf"\b(?P<cells>{N})\s+cells\s+on\s+(?P<platforms>{N})\s+platforms\b",
        rf"\b(?P<amd64>{N})\s+for\s+linux/amd64\b",
        rf"\b(?P<arm64>{N})\s+for\s+linux/arm64\b",
        rf"\b(?P<excluded>{N})\s+combinations\s+excluded\b",
        rf"\b(?P<tiers>{N})\s+(?:conformance\s+)?tiers\s+\(markers\)",
        rf"\bsuite\s+has\s+(?P<tiers>{N})\s+tiers\b",
        rf"\ball\s+(?P<tiers>{N})\s+tiers\b",
        *_profile_patterns(),
    ]
]


def number(word: str) -> int:
    return int(word) if word.isdigit() else NUMBER_WORDS.index(word.lower())


def figure_problems(text: str, doc: str = "<doc>") -> list[Problem]:
    """Stated counts that are not what the code computes."""
    truth = figures()
    flat = text.replace("\n", " ")  # sentences wrap; the offsets stay the same
    problems, seen = [], set()
    for pattern in FIGURE_PATTERNS:
        for m in pattern.finditer(flat):
            for key, said in m.groupdict().items():
                if said is None or m.start(key) in seen:
                    continue  # two patterns may read the same figure
                seen.add(m.start(key))
                if number(said) != truth[key]:
                    problems.append(
                        Problem(
                            doc,
                            line_of(text, m.start()),
                            f"says {said} in {' '.join(m.group().split())!r}: {key} is {truth[key]}",
                        )
                    )
    return problems


# --------------------------------------------------------------------------- 4. internal words

# Words of the development process that mean nothing to a reader of the docs.
INTERNAL_WORDS = (
    (r"\bissue\s+#?\d+", "an issue number of this repository's development"),
    (r"\bturn\s+\d+\b", "a development turn"),
    (r"\bsession\s+\d+\b", "a development session"),
    (r"\bthis\s+(?:[\w.,-]+\s+){0,3}machine(?![\w-])", "the machine the docs were written on"),
    (r"\bdevelopment\s+machine\b", "the machine the docs were written on"),
    (r"\bthe\s+machine\s+that\s+wrote\s+this\b", "the machine the docs were written on"),
    (r"\bthe\s+issue\s+(?:names|asks|says|wants)\b", "the issue this repository was developed from"),
    (r"\.\./shared\b", "../shared/: notes outside the repository"),
)


def internal_word_problems(text: str, doc: str = "<doc>") -> list[Problem]:
    problems = []
    flat = text.replace("\n", " ")
    for pattern, why in INTERNAL_WORDS:
        for m in re.finditer(pattern, flat, re.I):
            problems.append(Problem(doc, line_of(text, m.start()), f"{' '.join(m.group().split())!r}: {why}"))
    return problems


# --------------------------------------------------------------------------- 5. the suite's install

INSTALL_SCRIPT = ROOT / "scripts" / "installed-suite.sh"
INSTALL_MARKER = "<!-- installed-suite.sh: install -->"
SUITE_ARG = re.compile(r"requirements\.lock$|trainbase_conformance")


def install_script(doc: Path | None = None) -> subprocess.CompletedProcess:
    """`scripts/installed-suite.sh --install-commands`: the commands it runs to install the suite,
    read from README.md (or from doc)."""
    env = {k: v for k, v in os.environ.items() if k != "TRAINBASE_INSTALL_DOC"}
    if doc is not None:
        env["TRAINBASE_INSTALL_DOC"] = str(doc)
    return subprocess.run(
        ["bash", str(INSTALL_SCRIPT), "--install-commands"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def pip_install_args(line: str) -> tuple[str, ...] | None:
    """The arguments of a `pip install` (any pip: `suite/bin/pip`, `"$VENV/bin/pip"`, `python -m
    pip`) on a shell line, normalized: paths by their file name, --quiet left out; None for
    another command."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    for i, w in enumerate(words):
        if (
            w.rsplit("/", 1)[-1] in ("pip", "pip3")
            and words[i + 1 : i + 2] == ["install"]
            and (i == 0 or words[i - 1] != "-m")
        ):
            args = words[i + 2 :]
        elif w == "-m" and words[i + 1 : i + 3] == ["pip", "install"]:
            args = words[i + 3 :]
        else:
            continue
        return tuple(a if a.startswith("-") else a.rsplit("/", 1)[-1] for a in args if a not in ("-q", "--quiet"))
    return None


def suite_installs(lines: list[tuple[int, str]]) -> list[tuple[int, tuple[str, ...]]]:
    """(offset, arguments) of every `pip install` of the suite's lock or wheel among the lines."""
    out = []
    for at, line in lines:
        args = pip_install_args(line)
        if args and any(SUITE_ARG.search(a) for a in args):
            out.append((at, args))
    return out


def code_lines(text: str) -> list[tuple[int, str]]:
    """Every line of the fenced and indented code blocks, with its offset."""
    out = []
    for block_start, body in code_blocks(text):
        start = block_start
        for line in body.split("\n"):
            out.append((start, line))
            start += len(line) + 1
    return out + indented_code(text)


def hash_rule_problems(args: tuple[str, ...]) -> list[str]:
    """What pip refuses or leaves unchecked in one suite install: under --require-hashes every
    requirement needs a hash, which only a requirements file line carries (a wheel named on the
    command line has none: "Hashes are required in --require-hashes mode, but they are missing");
    a wheel installed without --no-deps would fetch its dependencies without a hash."""
    named, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-r", "-c", "--requirement", "--constraint"):
            skip = True
        elif not a.startswith("-"):
            named.append(a)
    cmd = "pip install " + " ".join(args)
    problems = []
    if "--require-hashes" in args and named:
        problems.append(
            f"`{cmd}`: --require-hashes refuses {', '.join(named)}, which has no hash (pip: 'Hashes "
            "are required in --require-hashes mode'): install the lock, then the wheel with --no-deps"
        )
    if any(n.endswith(".whl") for n in named) and "--no-deps" not in args:
        problems.append(
            f"`{cmd}`: without --no-deps pip fetches the wheel's dependencies unchecked (the "
            "hash-locked requirements install them)"
        )
    return problems


@functools.cache
def installed_suite_commands() -> tuple[tuple[str, ...], ...]:
    """The suite's install as scripts/installed-suite.sh runs it in .ci/run (README.md's block)."""
    out = install_script()
    assert out.returncode == 0, out.stderr
    return tuple(args for _, args in suite_installs(list(enumerate(out.stdout.splitlines()))))


def same_install(shown: tuple[str, ...], run: tuple[str, ...]) -> bool:
    return len(shown) == len(run) and all(a == b or fnmatch.fnmatch(a, b) for a, b in zip(shown, run, strict=True))


def install_problems(text: str, doc: str = "<doc>") -> list[Problem]:
    """A doc that installs the conformance suite shows the commands .ci/run runs (the README's
    marked block, through scripts/installed-suite.sh), all of them, and nothing pip refuses."""
    truth = installed_suite_commands()
    said = "; ".join("pip install " + " ".join(t) for t in truth)
    shown = suite_installs(code_lines(text))
    problems = []
    for at, args in shown:
        problems += [Problem(doc, line_of(text, at), why) for why in hash_rule_problems(args)]
        if not any(same_install(args, t) for t in truth):
            problems.append(
                Problem(
                    doc,
                    line_of(text, at),
                    f"`pip install {' '.join(args)}` is not what "
                    f"scripts/installed-suite.sh runs in .ci/run (README.md's marked block: {said})",
                )
            )
    missing = [t for t in truth if not any(same_install(args, t) for _, args in shown)]
    if shown and missing:
        problems.append(
            Problem(
                doc,
                line_of(text, shown[0][0]),
                "installs the suite without `pip install "
                + "`, `pip install ".join(" ".join(t) for t in missing)
                + "`",
            )
        )
    return problems


# --------------------------------------------------------------------------- 6. the interpreter

# build.py and the repository's modules need the dependencies scripts/setup.sh puts in .venv
BARE_PYTHON = re.compile(r"(?<![\w/.$-])python3?\s+(build\.py|-m\s+(?:pytest\b|trainbase\.)[\w.]*)")
# a page that activates the venv, or installs the requirements into the Python it runs, once
ENV_SAID = re.compile(r"source\s+\.venv/bin/activate|pip\s+install\s+(?:\S+\s+)*?-r\s+requirements(?:-dev)?\.txt")


def interpreter_problems(text: str, doc: str = "<doc>") -> list[Problem]:
    """`python build.py` / `python -m pytest|trainbase.*` where the page never says which Python."""
    if ENV_SAID.search(text):
        return []
    chunks = [(at, body) for at, body in code_blocks(text)] + inline_code(text) + indented_code(text)
    return [
        Problem(
            doc,
            line_of(text, at + m.start()),
            f"`python {' '.join(m.group(1).split())}`: the dependencies are in .venv (scripts/setup.sh): "
            f"`.venv/bin/python {' '.join(m.group(1).split())}`, or `source .venv/bin/activate` once on the page",
        )
        for at, chunk in chunks
        for m in BARE_PYTHON.finditer(chunk)
    ]


# --------------------------------------------------------------------------- 7. the CLI reference

OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def cli_reference(text: str) -> str:
    """README.md's reference of build.py: its `## CLI` section."""
    m = re.search(r"^## CLI\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    return m.group(1) if m else ""


def table_rows(section: str) -> list[list[str]]:
    """Each table row's cells (an escaped ``\\|`` stays inside its cell)."""
    return [
        [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        for line in section.split("\n")
        if line.startswith("|") and not re.match(r"\|[-|\s]+\|?$", line)
    ]


def cli_reference_problems(section: str) -> list[str]:
    """Per command of build.py: it has a row in the reference's command table, and each option it
    reads has a row in the option table whose "read by" column names the command (or says "every
    command"); every command a row names reads that row's options; every value of a choice and
    every --select key is named; every old action flag has a row naming its command."""
    from trainbase.cli import legacy
    from trainbase.cli.parser import parser, subparsers
    from trainbase.define.schema import AXES

    subs = subparsers(parser())
    reads = {name: {o for a in sp._actions for o in a.option_strings} for name, sp in subs.items()}
    rows = table_rows(section)
    shown_commands = {c for row in rows for c in re.findall(r"`build\.py ([a-z][a-z-]*)", row[0])}
    problems = [
        f"build.py {name}: a command the CLI reference does not list" for name in subs if name not in shown_commands
    ]
    option_rows = []  # (flags in the first column, the commands the second names)
    for row in rows:
        flags = OPTION.findall(row[0]) if row[0].startswith("`-") else []
        if not flags or len(row) < 2:
            continue
        if set(flags) <= set(legacy.OLD_FLAGS):  # the old spellings' table
            problems += [
                f"{f}: the CLI reference does not say it is now `build.py {legacy.OLD_FLAGS[f].command}`"
                for f in flags
                if not re.search(rf"(?<![\w-]){legacy.OLD_FLAGS[f].command}(?![\w-])", row[1])
            ]
            continue
        readers = (
            set(subs)
            if "every command" in row[1]
            else {c for c in re.findall(r"`([a-z][a-z-]*)`", row[1]) if c in subs}
        )
        option_rows.append((flags, readers))
        problems += [
            f"{flag}: the CLI reference says `{c}` reads it; build.py {c} has no such option"
            for flag in flags
            for c in sorted(readers)
            if flag not in reads[c]
        ]
        if not readers:
            problems += [f"{flag}: the CLI reference's row names no command that reads it" for flag in flags]
    problems += [
        f"build.py {name} {o}: an option of build.py {name} that the CLI reference does not list for it"
        for name, opts in reads.items()
        for o in sorted(opts)
        if not any(o in flags and name in readers for flags, readers in option_rows)
    ]
    known = set().union(*reads.values())
    problems += [
        f"{flag}: in the CLI reference's table, not an option of build.py"
        for flags, _ in option_rows
        for flag in flags
        if flag not in known
    ]
    actions = [a for sp in subs.values() for a in sp._actions if a.option_strings]
    problems += sorted(
        {
            f"{a.option_strings[-1]} {c}: a value build.py takes that the CLI reference does not name"
            for a in actions
            for c in a.choices or ()
            if not re.search(rf"(?<![\w-]){re.escape(c)}(?![\w-])", section)
        }
    )
    problems += [
        f"--select {k}=: a selection key the CLI reference does not name"
        for k in (*AXES, "name")
        if not re.search(rf"`{k}`|\b{k}=", section)
    ]
    return problems


# --------------------------------------------------------------------------- the real docs

CHECKERS = {
    "commands": command_problems,
    "paths": path_problems,
    "figures": figure_problems,
    "internal words": internal_word_problems,
    "suite install": install_problems,
    "interpreter": interpreter_problems,
}

VENV = ": the dependencies are in .venv (scripts/setup.sh): `.venv/bin/python {0}`, or `source .venv/bin/activate` once on the page"


def real_problems(checker: str) -> list[Problem]:
    check = CHECKERS[checker]
    # as a reader sees the page: a figure's value without the markers the render keeps it by
    return [p for path in user_docs() for p in check(as_read(path.read_text()), str(path.relative_to(ROOT)))]


def test_the_user_docs_are_the_ones_expected():
    names = {str(p.relative_to(ROOT)) for p in user_docs()}
    assert {
        "README.md",
        "docs/conformance.md",
        "examples/README.md",
        "packaging/conformance/README.md",
        "trainbase_conformance/checks/README.md",
    } <= names
    assert not any(n.startswith("tests/") for n in names)


@pytest.mark.parametrize("checker", list(CHECKERS))
def test_the_user_docs_have_no_problems(checker):
    found = real_problems(checker)
    assert not found, f"{len(found)} problem(s):\n" + "\n".join(map(str, found))


# --------------------------------------------------------------------------- planted defects
# Each checker on a small planted doc: the defect must be reported, the honest lines beside it not.


def whats(problems: list[Problem]) -> list[str]:
    return [p.what for p in problems]


HONEST_COMMANDS = """
```sh
python build.py --matrix --profile local --dry-run -j 2
python build.py build --profile local --dry-run -j 2 --select platform=linux/amd64
python build.py --list --all --select os=debian12 --select framework=pytorch,deepspeed
python build.py list --all --json --profile local
python build.py explain {EXCLUDED}
python build.py affected origin/main --json && python build.py bump torch --dry-run
python build.py --explain {EXCLUDED}    # an excluded combination
python build.py --ci-matrix --profile production \\
    --registry ghcr.io/OWNER/trainbase --only published
mpirun -np 4 tb-launch tb-doctor --cluster --allreduce
mpirun -np 4 tb-launch --tf python examples/tf_multiworker.py --workers 2   # the script's own option
.venv/bin/python -m pytest trainbase_conformance/checks -ra -m static --image REF --conformance-report out.md
trainbase-conformance IMAGE --tier gpu --require-hardware -k nccl --collect-only
docker run --rm --gpus all --shm-size=16g IMAGE tb-doctor --json | jq .summary
```
Options: `--select KEY=VALUE`, `--promote --registry R [--gate DIR]`, `--ulimit memlock=-1`,
`{ARM64}`, and `build.py --affected origin/main`.
"""
# names read from matrix.yaml (issue 65: adding or dropping a version leaves this test green)
EXAMPLES = {
    "{EXCLUDED}": excluded_example(matrix())[0],
    "{ARM64}": next(c.name for c in matrix().included if c.arch == "arm64" and not c.parent),
    "{UBUNTU_PYTORCH}": next(
        c.name for c in matrix().included if c.framework == "pytorch" and c.os.startswith("ubuntu")
    ),
    "{DEBIAN_BASE}": next(c.name for c in matrix().included if c.os.startswith("debian") and not c.parent),
}
for _key, _name in EXAMPLES.items():
    HONEST_COMMANDS = HONEST_COMMANDS.replace(_key, _name)


def test_commands_honest_lines_pass():
    assert command_problems(HONEST_COMMANDS) == []


@pytest.mark.parametrize(
    "planted, reported",
    [
        ("```sh\npython build.py --matrix --profile local --dryrun\n```", "build.py build has no option --dryrun"),
        ("`python build.py --matrix --profile local --no-such-flag`", "build.py build has no option --no-such-flag"),
        (
            "```\npython build.py ci-matrix     the plan\n  [--since REV] [--cover-all]\n```",
            "build.py ci-matrix has no option --cover-all",
        ),
        # each command takes only the options it reads, in the new spelling and the old alike
        ("`python build.py render --profile local`", "build.py render has no option --profile"),
        ("`python build.py --list --since HEAD`", "build.py list has no option --since"),
        ("`python build.py build --json`", "build.py build has no option --json"),
        (
            "```sh\nmpirun -np 4 tb-launch --tf-config python train.py --epochs 3\n```",
            "tb-launch has no option --tf-config",
        ),
        ("Run `tb-doctor --cluster --all-reduce` under mpirun.", "tb-doctor has no option --all-reduce"),
        ("```sh\ntrainbase-conformance IMAGE --tiers gpu\n```", "trainbase-conformance has no option --tiers"),
        (
            "```sh\n.venv/bin/python -m pytest trainbase_conformance/checks --image X --conformance-reprt out.md\n```",
            "pytest has no option --conformance-reprt",
        ),
        ("Pass `--zstd-twins` with `--push`.", "--zstd-twins: no documented command takes it"),
        ("`python build.py --list --profile nightly`", "build.py --profile nightly: no such profile"),
        ("`python build.py --list --select gpu=h100`", "build.py --select gpu=h100: unknown key 'gpu'"),
        (
            "`python build.py --list --select os=debian11`",
            "build.py --select os=debian11: os 'debian11' is not declared",
        ),
        (
            "`python build.py --matrix --select name=openmpi9.9-cuda12.8-cudnn9-debian12`",
            "build.py --select name=openmpi9.9-cuda12.8-cudnn9-debian12: name 'openmpi9.9-cuda12.8-cudnn9-debian12' "
            "is not declared",
        ),
        (
            "`python build.py --explain openmpi9.9-cuda12.8-cudnn9-debian12`",
            "build.py --explain openmpi9.9-cuda12.8-cudnn9-debian12: no such cell",
        ),
        (
            "`python build.py explain openmpi9.9-cuda12.8-cudnn9-debian12`",
            "build.py explain openmpi9.9-cuda12.8-cudnn9-debian12: no such cell",
        ),
        ("`python build.py list --select os=debian11`", "build.py --select os=debian11: os 'debian11' is not declared"),
    ],
)
def test_commands_report_a_planted_option_or_value(planted, reported):
    found = whats(command_problems(HONEST_COMMANDS + planted))
    assert len(found) == 1 and found[0].startswith(reported), found


HONEST_PATHS = """
See [the matrix](docs/matrix.md), [its section](docs/matrix.md#add-a-cuda-version), [top](#paths),
[upstream](https://github.com/open-mpi/ompi/blob/main/README.md) and docs/arm64.md.
`scripts/setup.sh`, `trainbase_conformance/checks/test_mpi.py::test_root_without_flags`, `locks/*.txt`,
`images/<cell>/Dockerfile`, `reports/supply/<cell>/<tag>/`, `/opt/trainbase/venv`, `trainbase/refresh`,
`trainbase/{DEBIAN_BASE}:latest`, `REGISTRY/trainbase/CELL@sha256:...`.
```sh
.venv/bin/python -m pytest tests/conformance/test_broken_variants.py --report reports/build.json
srun --container-image=registry.example.com#trainbase/{UBUNTU_PYTORCH}:rTAG true
```
"""
for _key, _name in EXAMPLES.items():
    HONEST_PATHS = HONEST_PATHS.replace(_key, _name)


def test_paths_honest_lines_pass():
    assert path_problems(HONEST_PATHS, "README.md") == []


@pytest.mark.parametrize(
    "doc, planted, reported",
    [
        ("README.md", "See [the guide](docs/nope.md).", "link to docs/nope.md: no such file"),
        ("docs/x.md", "See [tags](tag.md).", "link to tag.md: no such file"),
        (
            "README.md",
            "Notes: [perf](../shared/notes/performance.md).",
            "link to ../shared/notes/performance.md: outside the repository",
        ),
        ("README.md", "Run `scripts/nope.sh` first.", "scripts/nope.sh: no such path in the repository"),
        (
            "README.md",
            "```sh\n.venv/bin/python -m pytest tests/conformance/test_nope.py\n```",
            "tests/conformance/test_nope.py: no such path in the repository",
        ),
        ("README.md", "Details in docs/nope.md, below.", "docs/nope.md: no such path in the repository"),
        ("README.md", "The pip sets: `locks/*.nope`.", "locks/*.nope: no such path in the repository"),
        (
            "examples/README.md",
            "The job: `doctor/nope.yaml`.",
            "doctor/nope.yaml: no such path next to examples/README.md",
        ),
    ],
)
def test_paths_report_a_planted_broken_link_or_path(doc, planted, reported):
    honest = HONEST_PATHS if doc == "README.md" else ""  # its links are relative to the root
    assert whats(path_problems(honest + planted, doc)) == [reported]


def honest_figures() -> str:
    f = figures()
    return (
        f"Today's matrix: {f['cells']} cells on {NUMBER_WORDS[f['platforms']]} platforms -- {f['amd64']} for "
        f"linux/amd64 and {f['arm64']} for linux/arm64 -- and {f['excluded']} combinations excluded. The "
        f"`local` profile has {f['local_cells']} cells and {f['local_images']} images, the local "
        f"profile's {f['local_arm64_cells']} arm64 cells among them; the `ci` part, {f['ci_base_cells']} "
        f"base cells. The suite has {NUMBER_WORDS[f['tiers']]} tiers (markers). Two containers, 4 ranks.\n"
    )


def test_figures_honest_lines_pass():
    assert figure_problems(honest_figures()) == []


@pytest.mark.parametrize(
    "key, planted",
    [
        ("local_cells", "Measured on the {n} cells of the `local` profile."),
        ("local_images", "The `local` profile has {cells} cells and {n} images."),
        ("local_images", "the {n} local images add up to 53 GB"),
        ("local_arm64_cells", "# the local profile's {n} arm64 cells"),
        ("local_amd64_images", "Measured on the {n} amd64 images of the `local` profile."),
        ("ci_cells", "The `ci` profile has {n} cells and {ci_images} images."),
        ("ci_base_cells", "(the `ci` part,\n  {n} base cells: 10m10s)"),
        ("cells", "Today's matrix: {n} cells on two platforms."),
        ("arm64", "and {n} for linux/arm64 (Grace Hopper)"),
        ("tiers", "The conformance suite has {n} tiers (markers): ..."),
    ],
)
def test_figures_report_a_planted_stale_figure(key, planted):
    f = figures()
    stale = f[key] + 1
    said = NUMBER_WORDS[stale] if key == "tiers" else str(stale)
    text = planted.format(n=said, cells=f["local_cells"], ci_images=f["ci_images"])
    found = whats(figure_problems(honest_figures() + text))
    assert len(found) == 1, found
    assert found[0].startswith(f"says {said} in ") and found[0].endswith(f": {key} is {f[key]}"), found


HONEST_WORDS = """The PMIx session directory, pytorch/pytorch#190489 and AzureML-BERT#34, a machine-readable
report, your machine, in turn, the issue of stale caches, the build machine of your CI."""


def test_internal_words_honest_lines_pass():
    assert internal_word_problems(HONEST_WORDS) == []


PLANTED_WORDS = [
    "as decided in issue 24",
    "the Open MPI 4 image did (issue 28), because",
    "added in turn 3",
    "Measured in session 4 with tb-doctor",
    "Run here against the SBOMs of this machine's builds",
    "## The numbers (this 2-core, 24 GiB machine)",
    "no RDMA on the development machine",
    "reachable from the machine that wrote this",
    "the Mellanox signing key the issue names",
    "their pinned sha256 are in [notes](../shared/notes/performance.md)",
]


@pytest.mark.parametrize("planted", PLANTED_WORDS)
def test_internal_words_report_a_planted_phrase(planted):
    assert len(internal_word_problems(HONEST_WORDS + "\n" + planted)) == 1


def test_every_internal_word_pattern_has_a_planted_example():
    for pattern, _ in INTERNAL_WORDS:
        assert any(re.search(pattern, p, re.I) for p in PLANTED_WORDS), pattern


# --------------------------------------------------------------------------- the suite's install


def readme_install_block() -> str:
    """README.md's block after the marker, read here without the script."""
    text = (ROOT / "README.md").read_text()
    assert text.count(INSTALL_MARKER) == 1, "README.md marks exactly one block for scripts/installed-suite.sh"
    after = text.split(INSTALL_MARKER, 1)[1]
    return next(body for start, body in code_blocks(after) if not after[:start].strip("`sh \n"))


def test_installed_suite_runs_the_readme_block_as_it_is():
    out = install_script()
    assert out.returncode == 0, out.stderr
    assert out.stdout == readme_install_block()
    # .ci/run -> scripts/test.sh -> this script: the README's lines are what CI installs with
    assert "scripts/installed-suite.sh" in (ROOT / "scripts" / "test.sh").read_text()
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    cmds = installed_suite_commands()
    assert ("--require-hashes", "-r", "requirements.lock") in cmds
    assert ("--no-deps", "trainbase_conformance-*.whl") in cmds
    assert not [why for c in cmds for why in hash_rule_problems(c)]


def test_the_gpu_workflow_installs_the_suite_as_the_readme_does():
    text = (ROOT / ".github" / "workflows" / "gpu.yml").read_text()
    shown = suite_installs(list(enumerate(text.splitlines())))
    assert shown, "gpu.yml installs the suite"
    for _, args in shown:
        assert any(same_install(args, t) for t in installed_suite_commands()), args


OLD_ONE_LINER = "pip install --require-hashes -r requirements.lock trainbase_conformance-*.whl"


@pytest.mark.parametrize(
    "doc, reported",
    [
        ("no marker here\n```sh\npip install x\n```\n", "no install commands"),
        (f"{INSTALL_MARKER}\nthe commands:\n```sh\npip install x\n```\n", "must open a fenced code block"),
        (f"{INSTALL_MARKER}\n```sh\npip install x\n", "must open a fenced code block, closed"),
    ],
)
def test_installed_suite_refuses_a_doc_without_the_marked_block(tmp_path, doc, reported):
    (tmp_path / "README.md").write_text(doc)
    out = install_script(tmp_path / "README.md")
    assert out.returncode != 0 and reported in out.stderr, (out.returncode, out.stderr)


@pytest.mark.parametrize(
    "block, reported",
    [
        (
            f"python3 -m venv suite\nsuite/bin/{OLD_ONE_LINER}\n",
            "--require-hashes refuses trainbase_conformance-*.whl, which has no hash",
        ),
        (
            "python3 -m venv suite\nsuite/bin/pip install --require-hashes -r requirements.lock\n"
            "suite/bin/pip install trainbase_conformance-*.whl\n",
            "without --no-deps pip fetches",
        ),
    ],
)
def test_a_planted_install_block_is_run_as_it_is_and_its_defect_reported(tmp_path, block, reported):
    """The script runs whatever the marked block says (here: what it would run), so the block's
    defect is CI's; the hash rule names it before CI does (pip's own refusal: docs above)."""
    (tmp_path / "README.md").write_text(f"# x\n\n{INSTALL_MARKER}\n```sh\n{block}```\n")
    out = install_script(tmp_path / "README.md")
    assert out.returncode == 0 and out.stdout == block
    found = [
        why for _, args in suite_installs(list(enumerate(out.stdout.splitlines()))) for why in hash_rule_problems(args)
    ]
    assert any(reported in f for f in found), found


@pytest.mark.parametrize(
    "doc, planted, reported",
    [
        # the one-liner the docs showed: pip refuses it
        ("packaging/conformance/README.md", f"    {OLD_ONE_LINER}\n", "--require-hashes refuses"),
        ("packaging/conformance/README.md", f"    {OLD_ONE_LINER}\n", "is not what scripts/installed-suite.sh runs"),
        (
            "docs/conformance.md",
            "```sh\n~/suite/bin/pip install --no-deps other_suite-1.0-py3-none-any.whl -r requirements.lock\n```\n",
            "is not what scripts/installed-suite.sh runs",
        ),
        (
            "docs/conformance.md",
            "```sh\npython3 -m venv suite\nsuite/bin/pip install --require-hashes -r requirements.lock\n```\n",
            "installs the suite without `pip install --no-deps trainbase_conformance-*.whl`",
        ),
    ],
)
def test_a_doc_showing_another_install_than_ci_runs_is_reported(doc, planted, reported):
    found = whats(install_problems(planted, doc))
    assert any(w.startswith(reported) or reported in w for w in found), found


def test_the_docs_install_lines_match_ci_even_when_spelled_differently():
    """Another venv, a versioned wheel name, a path to the lock, --quiet: the same commands."""
    honest = (
        '```sh\n"$RUNNER_TEMP/suite/bin/pip" install --quiet --require-hashes -r packaging/conformance/requirements.lock\n'
        "~/venv/bin/pip install --no-deps dist/trainbase_conformance-0.1.0-py3-none-any.whl   # the wheel\n```\n"
    )
    assert install_problems(honest) == []


# --------------------------------------------------------------------------- the interpreter


@pytest.mark.parametrize(
    "planted, reported",
    [
        ("```sh\npython build.py --matrix --profile local\n```", "`python build.py`: the dependencies are in .venv"),
        ("Run `python3 build.py --list`.", "`python build.py`"),
        ("```sh\npython -m pytest tests/unit\n```", "`python -m pytest`"),
        ("```sh\npython -m trainbase.deliver.mirror --from A --to B\n```", "`python -m trainbase.deliver.mirror`"),
    ],
)
def test_interpreter_reports_a_bare_python(planted, reported):
    found = whats(interpreter_problems(planted))
    assert len(found) == 1 and found[0].startswith(reported), found


@pytest.mark.parametrize(
    "honest",
    [
        "```sh\n.venv/bin/python build.py --list\nsudo .venv/bin/python build.py --lock-bases\n```",
        "```sh\nsource .venv/bin/activate\npython build.py --list\n```",
        "```sh\npip install -r requirements-dev.txt\npython -m pytest tests/unit\n```",
        "Inside the image: `python -m trainbase_launch`, `python -c 'import trainbase_launch'`, `python3 -m venv v`.",
    ],
)
def test_interpreter_passes_a_page_that_says_which_python(honest):
    assert interpreter_problems(honest) == []


# --------------------------------------------------------------------------- the CLI reference


def test_the_cli_reference_lists_every_command_and_option_of_build_py():
    section = cli_reference((ROOT / "README.md").read_text())
    assert section.count("\n| `--") > 20, "README.md has a `## CLI` section with the option tables"
    assert section.count("\n| `build.py ") >= 17, "README.md's `## CLI` section has the command table"
    assert cli_reference_problems(section) == []


def drop_row(section: str, row_start: str) -> str:
    rows = [line for line in section.split("\n") if line.startswith(row_start)]
    assert len(rows) == 1, row_start
    return section.replace(rows[0] + "\n", "")


@pytest.mark.parametrize(
    "change, reported",
    [
        (lambda s: drop_row(s, "| `build.py prune`"), "build.py prune: a command the CLI reference does not list"),
        (lambda s: drop_row(s, "| `build.py merge-platforms"), "build.py merge-platforms: a command"),
        (lambda s: drop_row(s, "| `--locked`"), "build.py build --locked: an option of build.py build"),
        (lambda s: drop_row(s, "| `-j N`"), "build.py build -j: an option of build.py build"),
        # per command: a command the row leaves out, and one it names that does not read the option
        (
            lambda s: s.replace("| `--json` | `list`, `outdated`, `affected` |", "| `--json` | `list`, `outdated` |"),
            "build.py affected --json: an option of build.py affected that the CLI reference does not list",
        ),
        (
            lambda s: s.replace("| `--no-cache` | `build` |", "| `--no-cache` | `build`, `lint` |"),
            "--no-cache: the CLI reference says `lint` reads it; build.py lint has no such option",
        ),
        (
            lambda s: s.replace(
                "| `--explain NAME`, `--affected REV` | `build.py explain NAME`, `build.py affected REV` |",
                "| `--explain NAME`, `--affected REV` | `build.py explain NAME` |",
            ),
            "--affected: the CLI reference does not say it is now `build.py affected`",
        ),
        (lambda s: s.replace("\\|unpromoted", ""), "--only unpromoted: a value build.py takes"),
        (
            lambda s: s.replace("`--select platform=linux/amd64`", "`--select os=debian12`").replace(
                "`platform`, ", ""
            ),
            "--select platform=: a selection key",
        ),
        (
            lambda s: s.replace("| `--dry-run` |", "| `--dryrun` |"),
            "--dryrun: in the CLI reference's table, not an option",
        ),
    ],
)
def test_the_cli_reference_reports_a_planted_removal(change, reported):
    section = cli_reference((ROOT / "README.md").read_text())
    found = cli_reference_problems(change(section))
    assert any(f.startswith(reported) for f in found), found
