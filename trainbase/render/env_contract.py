"""The environment contract of the rendered Dockerfiles (issue 61): every ``$VAR`` a build
expands is set where the build expands it.

A RUN line's shell turns an unset ``$VIRTUAL_ENV`` into the empty string and goes on: the
manifest block's ``assert sys.prefix == '$VIRTUAL_ENV'`` (in double quotes, so expanded) failed
every conda (Ubuntu) row at the last step of its build, because only the venv (Debian) row sets
``ENV VIRTUAL_ENV``. A linter reads one line and cannot know what the base image or the parent
cell set, so this walks each Dockerfile's environment in order, as BuildKit does:

- a stage starts from what it is FROM: an earlier stage's environment at its end; a parent
  cell's final one (``FROM ${TRAINBASE_NAMESPACE}/<cell>:<tag>``, from ``images/<cell>/Dockerfile``);
  an external base's ``Env`` as ``locks/bases.json`` records it (``build.py lock-bases``), or
  for a base not locked here its family's contract below; global ARGs reach FROM lines only;
- ``ARG`` and ``ENV`` add to it (the pairs of one ENV see the environment before it, as Docker's);
- each ``$VAR``/``${VAR}`` that ENV, RUN, COPY/ADD, LABEL, WORKDIR... expand must be set there,
  unless the reference handles an unset one (``${VAR:-x}``) or the RUN sets it (``x=``, ``for x in``).

The scan is a small shell lexer, not a parser: single quotes are literal, ``\\$`` is no reference,
double quotes expand, ``$(...)`` is followed into, special parameters ($?, $1, $@) are never unset.
``python -m trainbase.render.env_contract [--root DIR] [CELL...]`` runs it on ``images/``.
"""

from __future__ import annotations

import argparse
import bisect
import re
import shlex
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..define import base_lock
from ..define.invocation import build_py

IMAGES_DIR = "images"
Env = dict[str, str]

# Docker's PATH for an image config without one: BuildKit's Dockerfile frontend adds it to every
# stage whose base lacks it (a FROM scratch bootstrap), so every RUN has a PATH.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Base families not locked here (no registry answered `lock-bases`), by the Env their images set.
# debian:* is PATH only: the official image's config sets DEFAULT_PATH, trainbase's own
# debootstrap (FROM scratch + ADD) gets it from BuildKit.
# nvidia/cuda:<v>-{base,runtime,devel}[-cudnn]-<os>: NVIDIA's Dockerfiles
# (gitlab.com/nvidia/container-images/cuda, dist/12.8.1/ubuntu2404/{base,runtime,devel,devel/cudnn}),
# read from the layer history of nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04 and -ubuntu22.04
# (`docker history`: ENV NVARCH ... ENV NV_CUDNN_PACKAGE_DEV) and a copy of 13.0.2's devel
# Dockerfile. Each flavour is FROM the one before and adds to its Env. Only names every row's base
# (12.8.1 to 13.2.1) sets are listed, so a use of one a release lacks is reported, not assumed:
# NV_NVPROF_* is gone in 13.0; NV_CUDA_COMPAT_PACKAGE went in 12.8 (cuda-compat installed by name),
# and with it /usr/local/nvidia/{bin,lib,lib64} from PATH and LD_LIBRARY_PATH (12.6 and before;
# the change is what vllm-project/vllm's images of 0.9.0, FROM nvidia/cuda:12.8.1, were reported for).


def _names(names: str, value: str = "<per release>") -> Env:
    return dict.fromkeys(names.split(), value)


_CUDA: dict[str, Env] = {
    "base": {
        "PATH": "/usr/local/cuda/bin:" + DEFAULT_PATH,
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        **_names("NVARCH NVIDIA_REQUIRE_CUDA NV_CUDA_CUDART_VERSION CUDA_VERSION"),
    },
    "runtime": {
        "NVIDIA_PRODUCT_NAME": "CUDA",
        **_names(
            "NV_CUDA_LIB_VERSION NV_NVTX_VERSION NV_LIBNPP_VERSION NV_LIBNPP_PACKAGE NV_LIBCUSPARSE_VERSION "
            "NV_LIBCUBLAS_PACKAGE_NAME NV_LIBCUBLAS_VERSION NV_LIBCUBLAS_PACKAGE NV_LIBNCCL_PACKAGE_NAME "
            "NV_LIBNCCL_PACKAGE_VERSION NCCL_VERSION NV_LIBNCCL_PACKAGE"
        ),
    },
    "devel": {
        "LIBRARY_PATH": "/usr/local/cuda/lib64/stubs",
        **_names(
            "NV_CUDA_CUDART_DEV_VERSION NV_NVML_DEV_VERSION NV_LIBCUSPARSE_DEV_VERSION NV_LIBNPP_DEV_VERSION "
            "NV_LIBNPP_DEV_PACKAGE NV_LIBCUBLAS_DEV_VERSION NV_LIBCUBLAS_DEV_PACKAGE_NAME NV_LIBCUBLAS_DEV_PACKAGE "
            "NV_CUDA_NSIGHT_COMPUTE_VERSION NV_CUDA_NSIGHT_COMPUTE_DEV_PACKAGE NV_LIBNCCL_DEV_PACKAGE_NAME "
            "NV_LIBNCCL_DEV_PACKAGE_VERSION NV_LIBNCCL_DEV_PACKAGE"
        ),
    },
    "cudnn": _names("NV_CUDNN_VERSION NV_CUDNN_PACKAGE_NAME NV_CUDNN_PACKAGE"),
    "cudnn-devel": _names("NV_CUDNN_PACKAGE_DEV"),
}

# Set in every RUN by bash or the engine, never by a Dockerfile (HOME: runc, from the user's
# passwd entry; HOSTNAME: BuildKit's sandbox). Names starting BASH are bash's too.
_SHELL_VARS = frozenset(
    _names(
        "HOME HOSTNAME PWD OLDPWD SHLVL IFS RANDOM SECONDS LINENO UID EUID PPID GROUPS PIPESTATUS "
        "FUNCNAME OPTARG OPTIND REPLY HOSTTYPE MACHTYPE OSTYPE _"
    )
)
# BuildKit's automatic platform ARGs: global without a declaration, in a stage once declared.
_AUTO_ARGS = frozenset(
    _names("TARGETPLATFORM TARGETOS TARGETARCH TARGETVARIANT BUILDPLATFORM BUILDOS BUILDARCH BUILDVARIANT")
)
# Instructions whose arguments the builder expands (SHELL, CMD, ENTRYPOINT are not expanded).
_EXPANDED = frozenset({"ADD", "COPY", "LABEL", "WORKDIR", "USER", "EXPOSE", "VOLUME", "STOPSIGNAL"})

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# ${#NAME} (length: 0 when unset), ${!NAME}, ${NAME<op>word}: -, = and + (with or without the
# colon) handle an unset NAME; ? fails the RUN, as a bare use would give it the wrong value.
_BRACED = re.compile(r"\{([#!]?)([A-Za-z_][A-Za-z0-9_]*)(:?[-=+?])?")
# What a RUN sets itself: assignments in command position (`x=1 cmd`, `&& x=$(...)`, also after
# export/local/declare/readonly; `echo X=$X` sets nothing), `for NAME in`, `read [-r] NAME...`.
_COMMAND = re.compile(r"(?:^|&&|\|\||[;&|({!`]|\b(?:then|do|else|elif|if|while|until)\b)\s*")
_ASSIGN = re.compile(r"([A-Za-z_]\w*)\+?=")
_DECLARE = frozenset({"export", "local", "declare", "typeset", "readonly"})
_FOR = re.compile(r"\bfor\s+([A-Za-z_]\w*)\s+in\b")
_READ = re.compile(r"\bread\s+(?:-\w+\s+)*((?:[A-Za-z_]\w*[ \t]*)+)")
_SEPARATOR = re.compile(r"[;&|]")
_CONTINUED = re.compile(r"\\[ \t]*$")
_RUN_FLAGS = re.compile(r"(?:--[a-z-]+(?:=\S*)?\s+)*")


@dataclass(frozen=True)
class Ref:
    name: str
    at: int  # offset of its `$` in the scanned text
    handled: bool  # ${NAME:-x} and kin: an unset NAME is what the expression is for


def scan(text: str, shell: bool = True) -> list[Ref]:
    """The variable references ``text`` expands: a RUN's shell (``shell``) or the builder's own
    expansion of ENV, COPY, LABEL... (no command substitution there)."""
    refs: list[Ref] = []
    stack: list[list[int]] = []  # open contexts, innermost last: [0] "...", [1, open parens] $(...)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        quoted = bool(stack) and stack[-1][0] == 0
        if c == "\\":  # an escaped character ($, ", ', newline) is never special
            i += 2
            continue
        if c == "$":
            i = _dollar(text, i, shell, refs, stack)
            continue
        if quoted:
            if c == '"':
                stack.pop()
        elif c == "'":  # literal up to the closing quote: no expansion inside
            j = text.find("'", i + 1)
            i = n if j < 0 else j + 1
            continue
        elif c == '"':
            stack.append([0])
        elif shell and c == "#" and (i == 0 or text[i - 1] in " \t;&|("):
            j = text.find("\n", i)  # a comment (the joined RUN line has no newline: to its end)
            i = n if j < 0 else j
            continue
        elif stack and c == "(":
            stack[-1][1] += 1
        elif stack and c == ")":
            if stack[-1][1]:
                stack[-1][1] -= 1
            else:
                stack.pop()
        i += 1
    return refs


def _dollar(text: str, i: int, shell: bool, refs: list[Ref], stack: list[list[int]]) -> int:
    nxt = text[i + 1 : i + 2]
    if nxt == "{":
        m = _BRACED.match(text, i + 1)
        if m is None:  # ${1}, ${@}, ${#}: positional and special parameters
            return i + 2
        refs.append(Ref(m.group(2), i, m.group(1) == "#" or (m.group(3) or "?")[-1] in "-=+"))
        return m.end()  # the word after the operator is scanned on: it may hold references too
    if shell and nxt == "(":  # $( and $((: followed into (the second paren is counted)
        stack.append([1, 0])
        return i + 2
    if shell and nxt == "'":  # $'...': ANSI-C quoting, literal
        j = text.find("'", i + 2)
        return len(text) if j < 0 else j + 1
    m = _NAME.match(text, i + 1)
    if m:
        refs.append(Ref(m.group(), i, False))
        return m.end()
    return i + 2 if nxt and nxt in "$?#@*!-0123456789" else i + 1  # special parameters; a lone $


def sets(run: str) -> set[str]:
    """The names a RUN line sets itself (wherever in the line: a use before the set is rare)."""
    out = {m.group(1) for m in _FOR.finditer(run)} | {n for m in _READ.finditer(run) for n in m.group(1).split()}
    for start in _COMMAND.finditer(run):
        declaring = False
        for w in _SEPARATOR.split(run[start.end() :], maxsplit=1)[0].split():  # its simple command
            assign = _ASSIGN.match(w)
            if assign or (declaring and _NAME.fullmatch(w)):
                out.add(assign.group(1) if assign else w)
            elif w in _DECLARE or (declaring and w.startswith("-")):
                declaring = True
            else:
                break  # the command word: what follows are its arguments
    return out


@dataclass(frozen=True)
class Instruction:
    line: int  # its first physical line
    keyword: str  # upper case
    text: str  # the logical line, continuations joined as the builder joins them
    body_at: int  # where the arguments start in text
    starts: tuple[int, ...]  # offset in text of each physical line joined into it
    lines: tuple[int, ...]  # ... and that line's number

    def line_of(self, at: int) -> int:
        return self.lines[bisect.bisect_right(self.starts, at) - 1]


def instructions(text: str) -> Iterator[Instruction]:
    pieces: list[tuple[int, str]] = []
    for no, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue  # a comment (or blank) line, also inside a continuation: the builder drops it
        cont = _CONTINUED.search(raw)
        pieces.append((no, raw[: cont.start()] if cont else raw))
        if not cont:
            yield _instruction(pieces)
            pieces = []
    if pieces:
        yield _instruction(pieces)


def _instruction(pieces: list[tuple[int, str]]) -> Instruction:
    starts, at = [], 0
    for _, p in pieces:
        starts.append(at)
        at += len(p)
    text = "".join(p for _, p in pieces)
    keyword = text.split(None, 1)[0]
    rest = text.lstrip()[len(keyword) :]
    return Instruction(
        pieces[0][0], keyword.upper(), text, len(text) - len(rest.lstrip()), tuple(starts), tuple(n for n, _ in pieces)
    )


def _words(body: str) -> list[str]:
    try:
        return shlex.split(body)
    except ValueError:  # an unbalanced quote: the builder fails on it anyway
        return body.split()


def _expand(value: str, env: Mapping[str, str]) -> str:
    """$X and ${X...} replaced by X's value: what a FROM names, and the values for reading (the
    check is on the names; quotes are gone by here, ${X:-word} operators are not applied)."""
    return re.sub(r"\$(?:\{(\w+)[^}]*\}|(\w+))", lambda m: env.get(m.group(1) or m.group(2), ""), value)


def family_env(ref: str) -> Env | None:
    """The contract of ``ref``'s base family (above), or None for a family without one."""
    name = ref.partition("@")[0]
    repo, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "")
    if repo.rsplit("/", 1)[-1] == "debian" or repo == "scratch":
        return {"PATH": DEFAULT_PATH} if repo != "scratch" else {}
    flavour = re.search(r"-(base|runtime|devel)-", f"-{tag}-")
    if not repo.endswith("nvidia/cuda") or flavour is None:
        return None
    layers = ["base", "runtime", "devel"][: ["base", "runtime", "devel"].index(flavour.group(1)) + 1]
    if "cudnn" in tag:
        layers += ["cudnn"] + (["cudnn-devel"] if flavour.group(1) == "devel" else [])
    return {k: v for layer in layers for k, v in _CUDA[layer].items()}


@dataclass(frozen=True)
class Finding:
    cell: str
    line: int
    stage: str
    var: str  # the unset variable; "" for a FROM with no environment to start from
    message: str

    def __str__(self) -> str:
        return f"{self.cell}/Dockerfile:{self.line}: {self.message}"


@dataclass
class _Stage:
    name: str  # its AS name, else its index; "" for the global ARGs before the first FROM
    env: Env  # what ENV set, from its start: what a stage or image built FROM it starts with
    origin: str  # where its environment started: "base nvidia/cuda:... contract", "parent <cell>; ..."
    args: Env = field(default_factory=dict)  # its ARGs: in RUN's environment, not in the image's

    def known(self) -> Env:
        return {**self.env, **self.args}


@dataclass
class Contract:
    """One check over cells' Dockerfiles: ``texts`` (cell -> text, e.g. rendered), else
    ``root/images/<cell>/Dockerfile``; a parent cell is read where a child names it."""

    root: Path
    texts: Mapping[str, str] = field(default_factory=dict)
    locks: Mapping[str, base_lock.BaseLock] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    instructions: int = 0
    final: dict[str, tuple[Env, str] | None] = field(default_factory=dict)  # cell -> (env, origin)

    def text(self, cell: str) -> str | None:
        p = self.root / IMAGES_DIR / cell / "Dockerfile"
        return self.texts.get(cell) or (p.read_text() if p.is_file() else None)

    def final_env(self, cell: str) -> tuple[Env, str] | None:
        """The environment ``cell``'s image ends with, and where it started; None when unknown."""
        if cell not in self.final:
            self.final[cell] = None  # a cycle of parents reads as unknown, not as recursion
            text = self.text(cell)
            self.final[cell] = self._walk(cell, text) if text is not None else None
        return self.final[cell]

    def summary(self) -> str:
        return (
            f"environment contract: {len(self.final)} Dockerfiles, {self.instructions} instructions read, "
            f"{len(self.findings)} unset variables"
        )

    def _start(self, ref: str) -> tuple[Env, str] | None:
        name = ref.partition("@")[0]
        repo = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
        parent = repo.rsplit("/", 1)[-1]
        if "/" in repo and self.text(parent) is not None:  # a framework image FROM its parent cell's
            got = self.final_env(parent)
            return (got[0], f"parent {parent}; {got[1]}") if got else None
        locked = [e.env for k, e in self.locks.items() if k.split(" ", 1)[0] == name and e.env is not None]
        if locked:
            return dict(v.split("=", 1) for v in locked[0] if "=" in v), f"base {name} lock"
        env = family_env(ref)
        return (env, f"base {name} contract") if env is not None else None

    def _walk(self, cell: str, text: str) -> tuple[Env, str] | None:
        glob = _Stage("", {}, "global ARGs", dict.fromkeys(_AUTO_ARGS, ""))  # for FROM lines only
        stages: dict[str, _Stage] = {}
        cur: _Stage | None = glob
        froms = 0
        for ins in instructions(text):
            self.instructions += 1
            body = ins.text[ins.body_at :]
            if ins.keyword == "FROM":
                self._check(cell, ins, glob, ins.body_at, scan(body, shell=False), glob.args)
                words = [w for w in body.split() if not w.startswith("--")]  # --platform=...
                ref = _expand(words[0], glob.args) if words else ""
                name = words[2].lower() if len(words) > 2 and words[1].lower() == "as" else str(froms)
                froms += 1
                earlier = stages.get(ref.lower())
                start = (earlier.env, earlier.origin) if earlier else self._start(ref)
                cur = None if start is None else _Stage(name, {"PATH": DEFAULT_PATH, **start[0]}, start[1])
                if cur is None:
                    self.findings.append(Finding(cell, ins.line, name, "", _no_start(ref)))
                else:
                    stages[name] = cur
            elif cur is None:
                continue  # after a FROM with no known start (reported there)
            elif ins.keyword == "ARG":
                self._check(cell, ins, cur, ins.body_at, scan(body, shell=False), cur.known())
                for w in _words(body):
                    key, eq, value = w.partition("=")
                    if eq:
                        cur.args[key] = value
                    elif key in glob.args:  # declared without a value: the global's (or BuildKit's)
                        cur.args[key] = glob.args[key]
                    # else unset: only a --build-arg sets it, and trainbase's builds pass the globals only
            elif ins.keyword == "ENV":
                known = cur.known()
                self._check(cell, ins, cur, ins.body_at, scan(body, shell=False), known)
                words = _words(body) or [""]
                pairs = [w.partition("=")[::2] for w in words] if "=" in words[0] else [(words[0], " ".join(words[1:]))]
                cur.env.update({k: _expand(v, known) for k, v in pairs})  # each pair sees the env before the ENV
            elif ins.keyword == "RUN":
                flags = _RUN_FLAGS.match(body)  # --mount=... --network=...: the builder's, not the shell's
                at = ins.body_at + (flags.end() if flags else 0)
                cmd = ins.text[at:]
                if not cmd.lstrip().startswith("["):  # the exec form runs no shell: nothing expands
                    refs = scan(cmd)
                    # a name the line guards anywhere (`if [ -n "${X:-}" ]; then ... $X`) is handled in it
                    own = sets(cmd) | {r.name for r in refs if r.handled}
                    self._check(cell, ins, cur, at, refs, {**cur.known(), **dict.fromkeys(own, "")})
            elif ins.keyword in _EXPANDED:
                self._check(cell, ins, cur, ins.body_at, scan(body, shell=False), cur.known())
        return (cur.env, cur.origin) if cur is not None and cur is not glob else None

    def _check(
        self, cell: str, ins: Instruction, stage: _Stage, at: int, refs: list[Ref], known: Mapping[str, str]
    ) -> None:
        """A finding for each variable of ``refs`` (offsets from ``at`` in ins.text) not in ``known``."""
        seen: set[str] = set()
        where = f"stage {stage.name}; {stage.origin}" if stage.name else stage.origin
        for r in refs:
            if r.handled or r.name in known or r.name in _SHELL_VARS or r.name.startswith("BASH") or r.name in seen:
                continue
            seen.add(r.name)  # once per instruction, at its first use
            what = f"{ins.keyword} uses ${r.name}, unset at this point ({where})"
            self.findings.append(Finding(cell, ins.line_of(at + r.at), stage.name or "global", r.name, what))


def _no_start(ref: str) -> str:
    return (
        f"FROM {ref}: not an earlier stage, a cell under {IMAGES_DIR}/, a base with an Env in "
        f"{base_lock.LOCK_FILE} nor one of a known family: record it with `{build_py()} lock-bases`, "
        "or add the family's contract to trainbase/render/env_contract.py"
    )


def check(root: Path, texts: Mapping[str, str] | None = None, cells: list[str] | None = None) -> Contract:
    """Walk ``cells`` (default: every cell of ``texts``, else every images/<cell>/Dockerfile)."""
    texts = texts or {}
    if cells is None:
        cells = sorted(texts) or sorted(p.parent.name for p in (root / IMAGES_DIR).glob("*/Dockerfile"))
    contract = Contract(root, texts, base_lock.load(root))
    for cell in cells:
        if contract.final_env(cell) is None and not any(f.cell == cell for f in contract.findings):
            contract.findings.append(Finding(cell, 0, "", "", f"no Dockerfile under {IMAGES_DIR}/{cell}"))
    return contract


def report(contract: Contract) -> int:
    """Print the findings (stderr) or the summary line; the exit code."""
    if not contract.findings:
        print(contract.summary())
        return 0
    cells = {f.cell for f in contract.findings}
    print(f"{contract.summary()} in {len(cells)} cell(s):", file=sys.stderr)
    for f in sorted(contract.findings, key=lambda f: (f.cell, f.line)):
        print(f"  {f}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainbase.render.env_contract", description=__doc__.splitlines()[0])
    p.add_argument(
        "--root", type=Path, default=Path(__file__).resolve().parents[2], help="the repository (images/, locks/)"
    )
    p.add_argument("cells", nargs="*", help="image directory names (default: all under images/)")
    a = p.parse_args(argv)
    return report(check(a.root, cells=a.cells or None))


if __name__ == "__main__":
    sys.exit(main())
