"""The refresh proposal's allow-list: which paths a `refresh.patch` may touch.

refresh.yml's `propose` job runs upstream code (pip builds sdists to read their metadata) and
hands its result on as a patch; the `pull-request` job, which holds `contents: write` and the
refresh token, applies it. So the patch is untrusted input: it may change only the data files
the refresh writes (`build.py --bump` -> matrix.yaml, `--lock` / `--lock-bases` / the security
rebuild epochs -> locks/, `--render` -> images/), as plain files (mode 100644, what every
tracked file there is). Anything else -- a script the write job runs, a workflow, a symlink, an
executable, a path that climbs out with `..` -- is refused by name, and the write job applies
nothing.

The paths are read from the patch text the way `git apply -p1` reads them (the `diff --git`
header, `rename from/to`, `copy from/to`, `---`/`+++`, mode lines), so renames, copies, mode
changes, new/deleted files and binary patches are all seen. The entry point also asks git
itself (`git apply --numstat -z`) where git is installed and refuses the union, so a header
this parser reads differently from git cannot slip a path through.

    python -m trainbase.deliver.refresh_patch reports/refresh.patch
        exit 0: every path allowed (listed); 1: refused paths, each named; 2: unreadable patch

Standard library only: the write job runs it from the base commit with the runner's python3,
installing nothing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# What the refresh writes (refresh.yml `propose`: `git add --all -- locks images matrix.yaml`).
ALLOWED_FILES = ("matrix.yaml",)
ALLOWED_DIRS = ("locks/", "images/")
# the one mode the rendered and locked files have; a symlink (120000), a submodule (160000) or
# an executable (100755) under locks/ or images/ is not something the refresh ever writes
PLAIN_FILE_MODE = "100644"

# `git apply --include` patterns for the same allow-list (git's wildmatch without WM_PATHNAME:
# `*` also matches `/`), so the apply step itself drops anything the check would refuse
GIT_APPLY_INCLUDES = ("matrix.yaml", "locks/*", "images/*")


class PatchError(ValueError):
    """The patch cannot be read (a header this module cannot place): refused as a whole."""


@dataclass
class PatchPaths:
    """Every path a patch touches (old and new names of a rename or copy), and the modes it sets."""

    paths: list[str] = field(default_factory=list)
    # path -> mode the patch gives it (new file mode / new mode / index line's mode)
    modes: dict[str, str] = field(default_factory=dict)

    def add(self, path: str) -> None:
        if path not in self.paths:
            self.paths.append(path)


_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"'}


def _unquote(name: str) -> str:
    """git's C-style quoting of a path with unusual bytes ("a/t\\303\\251st")."""
    if not (name.startswith('"') and name.endswith('"') and len(name) >= 2):
        return name
    body, out, i = name[1:-1], bytearray(), 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567":
                digits = re.match(r"[0-7]{1,3}", body[i + 1 :])
                assert digits is not None  # noqa: S101 -- nxt is an octal digit: the match has one
                out.append(int(digits.group(0), 8))
                i += 1 + len(digits.group(0))
                continue
            out += _C_ESCAPES.get(nxt, nxt).encode()
            i += 2
            continue
        out += ch.encode()
        i += 1
    return out.decode("utf-8", "surrogateescape")


def _strip_one(name: str) -> str | None:
    """A name as `git apply -p1` writes it: the first component dropped, whatever it is (a/, b/,
    or a no-prefix patch's own first directory). /dev/null: no file."""
    name = _unquote(name.strip())
    if name == "/dev/null":
        return None
    # a traditional `---` line may carry a tab and a timestamp after the name
    name = name.split("\t", 1)[0]
    if "/" not in name:
        raise PatchError(f"cannot place {name!r}: no leading component to strip (git apply -p1)")
    return name.split("/", 1)[1]


def _split_git_header(rest: str) -> tuple[str, str]:
    """`diff --git a/X b/Y` -> (a/X, b/Y). Quoted names are split by their quotes; unquoted
    ones at the space where both halves name the same file after their prefix (git does the
    same; a rename's differing names come from its `rename from/to` lines instead)."""
    if rest.startswith('"'):
        m = re.match(r'("(?:[^"\\]|\\.)*")\s+(.*)$', rest)
        if not m:
            raise PatchError(f"unreadable diff header: diff --git {rest}")
        return m.group(1), m.group(2)
    if rest.endswith('"'):
        m = re.match(r'(\S+)\s+("(?:[^"\\]|\\.)*")$', rest)
        if not m:
            raise PatchError(f"unreadable diff header: diff --git {rest}")
        return m.group(1), m.group(2)
    for at in [i for i, ch in enumerate(rest) if ch == " "]:
        left, right = rest[:at], rest[at + 1 :]
        if "/" in left and "/" in right and left.split("/", 1)[1] == right.split("/", 1)[1]:
            return left, right
    # differing names with no quotes: only a rename/copy can place them (its own lines follow)
    parts = rest.split(" ")
    if len(parts) == 2:
        return parts[0], parts[1]
    raise PatchError(f"unreadable diff header: diff --git {rest}")


_HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def touched_paths(patch_text: str) -> PatchPaths:
    """Every path the patch touches, read from its headers as `git apply -p1` would. Hunk
    bodies are skipped by their line counts (a removed line "-- x" reads "--- x", which is not a
    header), binary data by its alphabet (base85 has no space, every header has one)."""
    found = PatchPaths()
    current: list[str] = []  # the paths of the file section being read
    old_left = new_left = 0  # lines of the current hunk still to come

    def set_mode(mode: str) -> None:
        for p in current:
            found.modes[p] = mode

    # split on \n only: a content line may hold \r, \f or other breaks splitlines() would cut at
    for line in patch_text.split("\n"):
        if old_left > 0 or new_left > 0:
            if line.startswith("\\"):  # "\ No newline at end of file"
                continue
            tag = line[:1]
            if tag in (" ", ""):
                old_left, new_left = old_left - 1, new_left - 1
            elif tag == "-":
                old_left -= 1
            elif tag == "+":
                new_left -= 1
            else:
                raise PatchError(f"hunk ends early at {line[:60]!r}")
            continue
        if line.startswith("diff --git "):
            old, new = _split_git_header(line[len("diff --git ") :])
            current = [p for p in (_strip_one(old), _strip_one(new)) if p is not None]
            for p in current:
                found.add(p)
        elif line.startswith(("rename from ", "copy from ")):
            path = _unquote(line.split(" ", 2)[2])  # no prefix on these lines (git: p - 1)
            current.append(path)
            found.add(path)
        elif line.startswith(("rename to ", "copy to ")):
            path = _unquote(line.split(" ", 2)[2])
            current = [path]
            found.add(path)
        elif line.startswith(("new file mode ", "new mode ")) or re.fullmatch(r"index \S+ [0-7]{6}", line):
            set_mode(line.rsplit(" ", 1)[1])
        elif line.startswith(("--- ", "+++ ")):
            name = _strip_one(line[4:])
            if name is not None:
                if line.startswith("--- "):
                    current = [name]
                elif name not in current:
                    current.append(name)
                found.add(name)
        elif m := _HUNK.match(line):
            old_left = int(m.group(1)) if m.group(1) is not None else 1
            new_left = int(m.group(2)) if m.group(2) is not None else 1
    return found


def git_numstat_paths(patch_file: Path) -> list[str]:
    """The paths git itself reads from the patch (`git apply --numstat -z`, which applies
    nothing): a rename's two names included. Empty when git is not installed."""
    git = shutil.which("git")
    if git is None:
        return []
    proc = subprocess.run([git, "apply", "--numstat", "-z", str(patch_file)], check=False, capture_output=True)
    if proc.returncode != 0:
        raise PatchError(f"git apply --numstat cannot read the patch: {proc.stderr.decode(errors='replace').strip()}")
    # -z: "ADDED\tDELETED\tPATH\0", or for a rename/copy "ADDED\tDELETED\t\0OLD\0NEW\0"
    fields = proc.stdout.decode("utf-8", "surrogateescape").split("\0")
    paths: list[str] = []
    i = 0
    while i < len(fields):
        stat = fields[i]
        if not stat:
            i += 1
            continue
        parts = stat.split("\t")
        if len(parts) == 3 and parts[2]:
            paths.append(parts[2])
            i += 1
        else:
            paths += [p for p in fields[i + 1 : i + 3] if p]
            i += 3
    return paths


def is_allowed(path: str) -> bool:
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return False
    # .gitattributes / .gitmodules under an allowed folder would change how git treats files
    if any(p.startswith(".git") for p in parts):
        return False
    return path in ALLOWED_FILES or any(path.startswith(d) for d in ALLOWED_DIRS)


def refusals(found: PatchPaths, extra_paths: list[str] | None = None) -> list[str]:
    """One line per refused path: the path, then why."""
    out: list[str] = []
    for path in [*found.paths, *[p for p in extra_paths or [] if p not in found.paths]]:
        if not is_allowed(path):
            out.append(f"{path}: outside the refresh's allow-list ({', '.join(ALLOWED_FILES + ALLOWED_DIRS)})")
        elif path in found.modes and found.modes[path] != PLAIN_FILE_MODE:
            out.append(f"{path}: mode {found.modes[path]} (the refresh writes plain files, {PLAIN_FILE_MODE})")
    return out


def refused_paths(patch_text: str) -> list[str]:
    """The paths of the patch the write job must not apply: outside the allow-list, or not a
    plain file. An unreadable header refuses the patch as a whole (PatchError)."""
    found = touched_paths(patch_text)
    return [line.split(": ", 1)[0] for line in refusals(found)]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m trainbase.deliver.refresh_patch PATCH", file=sys.stderr)
        return 2
    patch_file = Path(args[0])
    try:
        text = patch_file.read_text(encoding="utf-8", errors="surrogateescape")
        found = touched_paths(text)
        from_git = git_numstat_paths(patch_file) if text.strip() else []
    except (OSError, PatchError) as e:
        print(f"refresh patch: refused as a whole: {e}", file=sys.stderr)
        return 2
    refused = refusals(found, from_git)
    if refused:
        for line in refused:
            print(f"refresh patch: refused {line}")
        print(
            f"refresh patch: {len(refused)} path(s) refused; nothing of the patch is applied "
            "(the refresh may change only matrix.yaml, locks/ and images/)"
        )
        return 1
    paths = found.paths + [p for p in from_git if p not in found.paths]
    for path in paths:
        print(f"refresh patch: allowed {path}")
    print(f"refresh patch: {len(paths)} path(s), all under the allow-list")
    return 0


if __name__ == "__main__":
    sys.exit(main())
