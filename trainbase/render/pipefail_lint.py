"""Pipelines that fail by chance under `pipefail`: a consumer that stops reading early.

`producer | grep -q X` under `set -o pipefail` (every rendered RUN line runs under
`SHELL ["/bin/bash", "-o", "pipefail", "-c"]`; the scripts use `set -euo pipefail`; GitHub's
`shell: bash` is `-eo pipefail`) exits 141 whenever grep finds its match and exits *before*
the producer's last write: that write gets SIGPIPE and pipefail reports it. Whether it
happens depends on scheduling and output size, so such a line passes most runs and fails
some -- on a loaded machine, a CI runner, a user's build (issue 27: `ldconfig -p | grep -q`
in the nccl block failed a fresh build). The same holds for every consumer that may exit
before EOF: `grep -q/-m/-l`, `head`, `sed ...q`, `awk ... exit`, `read`, `true`.

The rule is checked on the parsed shell, not with a regex over text: shfmt's parser (the
`shfmt-py` wheel carries the binary) turns each RUN line, script and workflow `run:` block
into its syntax tree, and every `|` node's right-hand command is inspected, so quoting,
command substitutions, `&&` chains and line continuations are read the way bash reads them.
A consumer that drains its input is the fix: `grep X >/dev/null` instead of `grep -q X`,
`sed -n '1,Np'` instead of `head -n N`, or a here-string (`grep -q X <<<"$(producer)"`).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import TrainbaseError

# grep options that make it stop at the first match (or the first N)
_GREP_EARLY_LONG = ("--quiet", "--silent", "--max-count", "--files-with-matches", "--files-without-match")
_GREP_EARLY_SHORT = set("qlLm")
_GREP_TAKES_ARG = set("efABCdD")
_GREPS = {"grep", "egrep", "fgrep", "zgrep", "rg"}
# a sed script containing the q/Q command (`5q`, `/x/q`, `1{p;q}`) quits before EOF
_SED_QUIT = re.compile(r"(^|[;{}\s\d$/])[qQ]\s*\d*\s*($|[;}])")
_AWK_EXIT = re.compile(r"\bexit\b")
# commands that never read (all) of their standard input
_NEVER_DRAIN = {
    "head": "head stops after its first lines",
    "read": "read takes one line",
    "true": "true reads nothing",
    ":": ": reads nothing",
    "false": "false reads nothing",
    "exit": "exit reads nothing",
}


@dataclass(frozen=True)
class Finding:
    where: str  # file[:line] and, for a rendered cell, the cell and its block
    pipeline: str  # the pipeline as written
    why: str  # which consumer stops early, and why that fails under pipefail

    def __str__(self) -> str:
        return f"{self.where}: `{self.pipeline}`: {self.why}"


def early_exit(words: Sequence[str | None]) -> str | None:
    """Why the command `words` may exit before reading all of its standard input, or None.
    Words that are not literal (a `$VAR`) are given as None and never match an option."""
    if not words or words[0] is None:
        return None
    cmd = Path(words[0]).name
    args = [w for w in words[1:] if w is not None]
    if cmd in ("sudo", "env", "command", "exec", "nice", "timeout", "stdbuf") and len(words) > 1:
        rest = [w for w in words[1:] if w is not None]
        while rest and (rest[0].startswith("-") or "=" in rest[0] or (cmd == "timeout" and rest[0][:1].isdigit())):
            rest = rest[1:]
        return early_exit(rest)
    if cmd in _NEVER_DRAIN:
        return _NEVER_DRAIN[cmd]
    if cmd in _GREPS:
        skip = False
        for a in args:
            if skip:  # the argument of -e/-f/-A ... given as its own word
                skip = False
                continue
            if a == "--":
                break
            if not a.startswith("-") or a == "-":
                continue
            if a.startswith("--"):
                if a.split("=", 1)[0] in _GREP_EARLY_LONG:
                    return f"{cmd} {a.split('=', 1)[0]} stops reading at its first match"
                skip = a in ("--regexp", "--file")
                continue
            for k, c in enumerate(a[1:], 1):  # a cluster like -qE, -Fxq, -m1
                if c in _GREP_EARLY_SHORT:
                    return f"{cmd} -{c} stops reading at its first match"
                if c in _GREP_TAKES_ARG:  # the rest of the cluster, or the next word, is its argument
                    skip = k == len(a) - 1
                    break
        return None
    if cmd == "sed":
        scripts = _sed_scripts(args)
        if any(_SED_QUIT.search(s) for s in scripts):
            return "the sed script quits (q) before the end of its input"
        return None
    if cmd in ("awk", "gawk", "mawk"):
        prog = next((a for a in args if not a.startswith("-")), "")
        if _AWK_EXIT.search(prog):
            return f"the {cmd} program may exit before the end of its input"
    return None


def _sed_scripts(args: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a in ("-e", "--expression") and i + 1 < len(args):
            out.append(args[i + 1])
            i += 2
            continue
        if a.startswith("--expression="):
            out.append(a.split("=", 1)[1])
        elif not a.startswith("-") and not out:
            out.append(a)  # the first operand is the script when no -e was given
        i += 1
    return out


# -- the shell parser ------------------------------------------------------------------------
def shfmt_binary() -> str:
    exe = shutil.which("shfmt") or str(Path(sys.executable).parent / "shfmt")
    if not Path(exe).exists():
        raise TrainbaseError("shfmt is not installed: `pip install -r requirements-dev.txt` (shfmt-py)")
    return exe


@lru_cache(maxsize=4096)
def _parse(src: str) -> dict[str, Any]:
    proc = subprocess.run(
        [shfmt_binary(), "-ln", "bash", "--to-json"], input=src.encode(), capture_output=True, check=False
    )
    if proc.returncode != 0:
        raise ShellSyntaxError(proc.stderr.decode(errors="replace").strip())
    tree: dict[str, Any] = json.loads(proc.stdout)
    return tree


class ShellSyntaxError(ValueError):
    pass


def _word(node: dict[str, Any]) -> str | None:
    """A word's literal value (quotes removed), or None when any part of it is expanded."""
    out = []
    for part in node.get("Parts", []):
        t = part.get("Type")
        if t == "Lit" or t == "SglQuoted":
            out.append(part.get("Value", ""))
        elif t == "DblQuoted":
            inner = _word(part)
            if inner is None:
                return None
            out.append(inner)
        else:
            return None
    return "".join(out)


def _consumer_words(stmt: dict[str, Any] | None) -> list[str | None] | None:
    """The words of the command a pipeline stage runs, when it is a simple command."""
    cmd = (stmt or {}).get("Cmd") or {}
    if cmd.get("Type") == "CallExpr":
        return [_word(a) for a in cmd.get("Args", [])]
    if cmd.get("Type") in ("Block", "Subshell"):
        stmts = cmd.get("Stmts") or []
        return _consumer_words(stmts[0]) if stmts else None
    return None


def check_shell(src: str, where: str, first_line: int | None = 1) -> list[Finding]:
    """Every pipeline in `src` whose consumer may stop reading early, reported as
    `where:LINE` with LINE counted from `first_line` (None: `where` alone, e.g. a RUN)."""
    data = src.encode()
    tree = _parse(src)
    found: list[Finding] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("Type") == "BinaryCmd" and node.get("Op") in ("|", "|&"):
                why = early_exit(_consumer_words(node.get("Y")) or [])
                if why:
                    a, b = node["Pos"]["Offset"], node["End"]["Offset"]
                    text = " ".join(data[a:b].decode(errors="replace").split())
                    at = where if first_line is None else f"{where}:{first_line + node['Pos']['Line'] - 1}"
                    found.append(
                        Finding(
                            at,
                            text,
                            f"{why}; under pipefail the producer's next write gets SIGPIPE "
                            f"(exit 141) by chance -- use a consumer that reads to the end",
                        )
                    )
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(tree)
    return found


# -- where shell lives ------------------------------------------------------------------------
_RUN_FLAGS = re.compile(r"^(\s*--[a-z-]+(=\S*)?)+\s+")
_BLOCK = re.compile(r"^# --- block: (\w[\w-]*)")


def check_dockerfile(text: str, where: str) -> list[Finding]:
    """Each shell-form RUN of a Dockerfile, named by its line and the building block it came
    from (the `# --- block: NAME` comment every block starts with)."""
    from dockerfile_parse import DockerfileParser

    lines = text.splitlines()
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()))
    found = []
    for ins in parser.structure:
        if ins["instruction"] != "RUN" or ins["value"].lstrip().startswith("["):
            continue
        block = next((m.group(1) for ln in reversed(lines[: ins["startline"]]) if (m := _BLOCK.match(ln))), "-")
        script = _RUN_FLAGS.sub("", ins["value"], count=1)
        at = f"{where}:{ins['startline'] + 1}-{ins['endline'] + 1} (block {block})"
        try:
            found += check_shell(script, at, first_line=None)
        except ShellSyntaxError as e:
            found.append(Finding(at, script[:80], f"the RUN line does not parse as bash: {e}"))
    return found


_GH_EXPR = re.compile(r"\$\{\{.*?\}\}", re.S)


def check_workflow(path: Path, root: Path) -> list[Finding]:
    """Every `run:` block of a workflow or composite action (`${{ ... }}` read as one word)."""
    from trainbase_common import safe_io

    rel = path.relative_to(root)
    try:  # a workflow naming a key twice runs only the last one: refused, not guessed at
        doc = safe_io.load_yaml(path) or {}
    except safe_io.InputError as e:
        raise TrainbaseError(str(e).replace(str(path), str(rel), 1)) from None
    text = path.read_text().splitlines()
    found = []
    for run in _runs(doc):
        script = _GH_EXPR.sub("GH_EXPR", run)
        found += check_shell(script, str(rel), first_line=_first_line(text, run) or 1)
    return found


def _runs(node: Any) -> list[str]:
    if isinstance(node, dict):
        out = [node["run"]] if isinstance(node.get("run"), str) else []
        for k, v in node.items():
            if k != "run":
                out += _runs(v)
        return out
    if isinstance(node, list):
        return [r for v in node for r in _runs(v)]
    return []


def _first_line(text: list[str], run: str) -> int | None:
    """The file line where a run block's first line is (1-based), for messages."""
    head = run.strip().splitlines()[0].strip() if run.strip() else ""
    for i, ln in enumerate(text, 1):
        if head and ln.strip().endswith(head) and ("run:" in ln or ln.strip() == head):
            return i
    return None


def shell_files(root: Path) -> list[Path]:
    """The repository's own shell programs: scripts/, .ci/, bench/ and the in-image toolbox."""
    out = []
    for d in ("scripts", ".ci", "bench", "imagefs"):
        for p in sorted((root / d).rglob("*")):
            if p.is_file() and (p.suffix == ".sh" or _shebang_is_shell(p)):
                out.append(p)
    return out


def _shebang_is_shell(p: Path) -> bool:
    try:
        first = p.open("rb").readline(200)
    except OSError:
        return False
    return bool(re.match(rb"#!\s*(/usr)?/bin/(env\s+)?(ba|da)?sh\b", first))


def check_repository(root: Path, dockerfiles: dict[str, str]) -> list[Finding]:
    """The whole rule: rendered Dockerfiles (name -> text), workflows, actions, scripts, tools."""
    found = []
    for name, text in sorted(dockerfiles.items()):
        found += check_dockerfile(text, name)
    for p in sorted((root / ".github").rglob("*.y*ml")):
        found += check_workflow(p, root)
    for p in shell_files(root):
        found += check_shell(p.read_text(), str(p.relative_to(root)))
    for p in repository_dockerfiles(root):
        found += check_dockerfile(p.read_text(), str(p.relative_to(root)))
    return found


def repository_dockerfiles(root: Path) -> list[Path]:
    """Dockerfiles the repository keeps besides the rendered ones (the suite's broken variants,
    the foreign image's rebuild): they build FROM trainbase images, whose SHELL has pipefail,
    so the rule holds for them too (a broken variant once failed its own build by chance on
    `ucx_info -b | grep -Eq`: exit 141)."""
    return sorted(p for d in ("tests", "bench") for p in (root / d).rglob("Dockerfile*") if p.is_file())


def command(rendered: dict[str, Any], root: Path) -> int:
    """`build.py --lint`'s second half: no pipeline that can die of SIGPIPE under pipefail, in
    the rendered RUN lines (``rendered``: cell -> Rendered) and in the repository's own shell."""
    findings = check_repository(root, {r.dockerfile: r.files[r.dockerfile] for r in rendered.values()})
    for f in findings:
        print(f"{f}")
    print(
        f"pipefail: {len(rendered)} Dockerfile(s) and the repository's shell, {len(findings)} pipeline(s) that "
        f"can fail by chance"
    )
    return 1 if findings else 0
