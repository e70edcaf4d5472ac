"""Source trees no registry ships (matrix.yaml's ``sources``), fetched and verified before a build.

A source is pinned by its commit and by its content, the git tree id of the unpacked archive.
GitHub's archive of the commit (where GitHub answers) and a mirror's ``git archive`` of it (here:
``../shared/sources``, or TRAINBASE_SOURCE_MIRROR) differ in their bytes -- another gzip -- but
hold one tree, so both are verified the same way: the tree id is git's own of the unpacked
archive (a configuration-free `git add -A -f && git write-tree`), and the commit its pax header
names must be the pinned one where it names one. An archive that does not match is refused,
naming it; nothing unverified is staged.

Verified archives are staged under ``build-sources/`` in the checkout (git-ignored, listed in
.dockerignore), where the Dockerfiles bind-mount them: the recipe names the source by its pin,
and BuildKit's cache key covers the bytes it reads. Verification runs on the host because the
build context is the only way into a classic BuildKit build (Docker 20.10 has no named contexts).
"""

from __future__ import annotations

import http.client
import os
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..define.schema import Source, staged_source
from ..errors import TrainbaseError

MIRROR_ENV = "TRAINBASE_SOURCE_MIRROR"
GITHUB_TIMEOUT_S = 60


class SourceError(TrainbaseError):
    """An archive that is not the pinned source, or one that no way could fetch."""


def github_url(src: Source) -> str:
    """GitHub's archive of the pinned commit (never of the tag: a tag can be moved)."""
    return f"https://codeload.github.com/{src.repository}/tar.gz/{src.commit}"


# the checkout this trainbase runs from: a scratch checkout elsewhere (a test's, a second
# worktree) still finds the team's mirror beside it
TOOL_ROOT = Path(__file__).resolve().parents[2]


def default_mirror(root: Path) -> Path:
    """TRAINBASE_SOURCE_MIRROR, else the team's mirror beside the checkout being built
    (../shared/sources), else the one beside the checkout trainbase runs from."""
    env = os.environ.get(MIRROR_ENV)
    if env:
        return Path(env)
    candidates = [d.parent / "shared" / "sources" for d in dict.fromkeys((root.resolve(), TOOL_ROOT))]
    return next((c for c in candidates if c.is_dir()), candidates[0])


# -- the tree id -----------------------------------------------------------------------------------
def _git(cwd: Path, *args: str) -> str:
    """git with no user or system configuration: autocrlf, filters or hooks of the host must not
    change what is hashed (the archive's own .gitattributes apply, as they did upstream)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "trainbase",
        "GIT_AUTHOR_EMAIL": "trainbase@invalid",
    }
    try:
        p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300, check=False)
    except FileNotFoundError:
        raise SourceError("git is not installed: it hashes a source's tree (scripts/setup.sh installs it)") from None
    if p.returncode != 0:
        raise SourceError(f"git {' '.join(args)} in {cwd}: {p.stderr.strip()[-400:]}")
    return p.stdout.strip()


def tree_of(archive: Path) -> tuple[str, str | None]:
    """(the git tree id of the archive's one top folder, the commit its pax header names or None).

    The tree id is git's own (`git add -A -f && git write-tree` in the unpacked top folder): the
    archive's .gitattributes apply as they do upstream (libfabric's *.cmd files are CRLF in the
    archive and LF in the tree). ``git archive`` (GitHub's archives too) writes the commit id into
    the global pax header. Members that would land outside the folder are refused (tarfile's
    "data" filter)."""
    with tempfile.TemporaryDirectory(prefix="trainbase-source-") as tmp:
        try:
            with tarfile.open(archive, "r:*") as tf:
                commit = tf.pax_headers.get("comment")
                tops = {PurePosixPath(m.name).parts[0] for m in tf.getmembers() if PurePosixPath(m.name).parts}
                if len(tops) != 1:
                    raise SourceError(f"{archive}: not one top folder ({', '.join(sorted(tops)) or 'empty'})")
                tf.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError, EOFError) as e:
            raise SourceError(f"{archive}: not a readable source archive ({e})") from None
        top = Path(tmp) / tops.pop()
        if not top.is_dir():
            raise SourceError(f"{archive}: its top entry is not a folder")
        _git(top, "init", "-q")
        _git(top, "add", "-A", "-f")
        return _git(top, "write-tree"), commit


def verify(archive: Path, key: str, src: Source) -> None:
    """Refuse ``archive`` unless it is the pinned source: its tree, and its commit where it names one."""
    tree, commit = tree_of(archive)
    if tree != src.tree:
        raise SourceError(
            f"source {key}: {archive} holds tree {tree}, not the pinned {src.tree} "
            f"({src.repository} {src.tag} at {src.commit}): refused"
        )
    if commit is not None and commit != src.commit:
        raise SourceError(
            f"source {key}: {archive} is an archive of commit {commit}, not the pinned {src.commit} "
            f"({src.repository} {src.tag}): refused"
        )


# -- fetching -------------------------------------------------------------------------------------
def _download(url: str, dest: Path) -> None:
    with urllib.request.urlopen(url, timeout=GITHUB_TIMEOUT_S) as r, dest.open("wb") as out:  # noqa: S310 -- https, a pinned commit
        while chunk := r.read(1 << 20):
            out.write(chunk)


@dataclass(frozen=True)
class Staged:
    key: str
    path: Path  # the verified archive in the checkout (staged_source)
    origin: str  # where it came from: "staged before", "GitHub (URL)", "the mirror (PATH)"


def stage(
    key: str,
    src: Source,
    root: Path,
    mirror: Path | None = None,
    download: Callable[[str, Path], None] = _download,
) -> Staged:
    """The verified archive of ``src`` in the checkout (staged_source): the one staged before if it still
    verifies, else GitHub's archive of the commit, else the mirror's file. Raises SourceError with
    every way's reason when none gives the pinned tree; a mismatching archive is never staged."""
    dest = root / staged_source(key)
    reasons: list[str] = []
    if dest.exists():
        try:
            verify(dest, key, src)
            return Staged(key, dest, "staged before")
        except SourceError as e:
            reasons.append(f"the staged {dest.name} was not the source ({e}); removed")
            dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    url = github_url(src)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        fetched = Path(tmp) / dest.name
        try:
            download(url, fetched)
            verify(fetched, key, src)
            fetched.replace(dest)
            return Staged(key, dest, f"GitHub ({url})")
        except SourceError as e:
            reasons.append(f"GitHub's archive: {e}")
        except (urllib.error.URLError, http.client.HTTPException, OSError, TimeoutError) as e:
            reasons.append(f"GitHub did not answer ({url}: {getattr(e, 'reason', e)})")
    mirror = mirror if mirror is not None else default_mirror(root)
    candidate = mirror / src.mirror_file
    if candidate.is_file():
        try:
            verify(candidate, key, src)
        except SourceError as e:
            reasons.append(f"the mirror's file: {e}")
        else:
            tmp_dest = dest.with_suffix(".partial")
            try:
                tmp_dest.write_bytes(candidate.read_bytes())
                tmp_dest.replace(dest)
                return Staged(key, dest, f"the mirror ({candidate}); " + "; ".join(reasons))
            except OSError as e:  # a full disk under the checkout: said, never half-staged
                tmp_dest.unlink(missing_ok=True)
                reasons.append(f"the mirror's verified file could not be staged in {dest.parent}: {e.strerror or e}")
    else:
        reasons.append(f"the mirror has no {src.mirror_file} ({mirror}; set {MIRROR_ENV} to another)")
    raise SourceError(f"source {key} ({src.repository} {src.tag}): " + "; ".join(reasons))


def stage_all(
    sources: dict[str, Source], keys: Iterable[str], root: Path, mirror: Path | None = None
) -> tuple[dict[str, Staged], dict[str, str]]:
    """Each named source staged, or why not: (staged by key, reason by key)."""
    staged: dict[str, Staged] = {}
    failed: dict[str, str] = {}
    for key in dict.fromkeys(keys):
        try:
            staged[key] = stage(key, sources[key], root, mirror)
        except SourceError as e:
            failed[key] = str(e)
    return staged, failed
