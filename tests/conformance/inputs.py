"""What a check's unit evidence reads, so a mutation run can take a check's recorded outcomes when
none of it changed (tests/conformance/mutation.py, issue 72).

The evidence of a check is run once unmutated (the baseline) before its mutants; in that forked
child an audit hook (PEP 578) notes every file of the repository it opens (a module imported from
its cached ``.pyc`` counts as its source), every folder it lists and every repository file a
subprocess it starts is handed. The record keeps those paths and a digest of their contents; a
later run recomputes the digest over the same paths and, where it is equal and the check's own
text, evidence and mutants are too, the outcome of every mutant is the recorded one: the evidence
would read the same bytes and take the same branches, so it would decide the same. A change to any
of them (or to the Python, the locked dependencies, or this harness) re-runs that check's mutants.
Nothing here is a guess about imports: what is digested is what the run itself opened.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

# never inputs: the repository's history, the environment (the lock below stands for it), outputs
IGNORED_TOP = {".git", ".venv", "reports", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
# inputs of every check: the locked dependencies (what site-packages holds) and the harness itself
ALWAYS = ("requirements-dev.lock", "tests/conformance/mutation.py", "tests/conformance/inputs.py")


def repo_path(root: Path, path: object) -> str | None:
    """``path`` as a path relative to ``root`` when it names something inside the repository (and
    not in IGNORED_TOP); a ``__pycache__/NAME.*.pyc`` is its module's ``NAME.py``."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)):
        return None  # a file descriptor
    p = os.path.abspath(os.fspath(path))
    base = str(root)
    if p == base:
        return "."
    if not p.startswith(base + os.sep):
        return None
    rel = p[len(base) + 1 :]
    if rel.split(os.sep, 1)[0] in IGNORED_TOP:
        return None
    head, name = os.path.split(rel)
    if os.path.basename(head) == "__pycache__" and name.endswith(".pyc"):
        rel = os.path.join(os.path.dirname(head), name.split(".", 1)[0] + ".py")
    return rel.replace(os.sep, "/")


_MACHINERY = ("importlib", "_pytest", "pluggy")


def _by_machinery(frame) -> bool:
    """Whether the nearest frames below the audit event are the import system's or pytest's."""
    for _ in range(6):
        if frame is None:
            return False
        name = frame.f_globals.get("__name__", "")
        if name.split(".", 1)[0] in _MACHINERY or frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


class Tracker:
    """Collects what the process reads from the repository, from the moment ``start`` is called
    (an audit hook cannot be removed: start it only in a child that exits after its run)."""

    def __init__(self, root: Path):
        self.root = root
        self.seen: set[str] = set()

    def _hook(self, event: str, args: tuple) -> None:
        if event == "open":
            rel = repo_path(self.root, args[0])
            if rel and rel != ".":
                self.seen.add(rel)
        elif event in ("os.listdir", "os.scandir"):
            rel = repo_path(self.root, args[0] if args and args[0] is not None else ".")
            if not rel:
                return
            if _by_machinery(sys._getframe(1)):
                # the import system's and pytest's own folder scans: what they act on in a folder is
                # its conftest.py and __init__.py (each a file, hashed, or "<gone>"), not a new
                # neighbour module no one imports
                at = "" if rel == "." else rel + "/"
                self.seen.update({f"{at}conftest.py", f"{at}__init__.py"})
            else:
                self.seen.add("./" if rel == "." else rel + "/")
        elif event == "subprocess.Popen":
            argv = args[1] if len(args) > 1 else None
            for a in [argv] if isinstance(argv, (str, bytes)) else list(argv or ()):
                if isinstance(a, (str, bytes, os.PathLike)):
                    rel = repo_path(self.root, a)
                    if rel and rel != "." and os.path.isfile(self.root / rel):
                        self.seen.add(rel)

    def start(self) -> None:
        sys.addaudithook(self._hook)

    def paths(self) -> list[str]:
        return sorted(self.seen | set(ALWAYS))


def digest(root: Path, paths: list[str], own: str) -> str:
    """One sha256 over the interpreter, ``own`` (the check's text, evidence and mutants) and each
    path's state: a file's bytes, a folder's sorted names, or that it is gone."""
    h = hashlib.sha256()
    h.update(f"python {sys.version}\n".encode())
    h.update(own.encode())
    for rel in sorted(set(paths) | set(ALWAYS)):
        h.update(b"\0" + rel.encode() + b"\0")
        p = root / rel.rstrip("/")
        if rel.endswith("/"):
            h.update("\n".join(sorted(os.listdir(p))).encode() if p.is_dir() else b"<gone>")
        elif p.is_file():
            h.update(hashlib.sha256(p.read_bytes()).digest())
        else:
            h.update(b"<gone>")
    return h.hexdigest()
