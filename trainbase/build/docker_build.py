"""One image's `docker build`: its command line, the disk it needs, and the line of its log
that says why it failed. Which job builds when, in parallel, with its log streamed and Ctrl-C
honoured, is the executor's; what one build is, is here.

The command is BuildKit's (trainbase_common.buildkit): the recipe and the immutable tag as
labels, a root cell's base as resolved for this run (bases.py) as labels and as the
TRAINBASE_BASE build argument where its row takes one, the host's CA bundle as a BuildKit
secret (never in a layer), and the `image` target of a base cell's Dockerfile.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from trainbase_common import buildkit, engine

from ..errors import TrainbaseError
from . import bases
from .plan import Job

DEFAULT_CA = "/etc/ssl/certs/ca-certificates.crt"


def ca_bundle(value: str | None) -> str | None:
    """--ca-bundle auto|none|PATH. auto: the host's bundle if it has one (it is passed as a
    BuildKit secret, so it never lands in a layer; behind an intercepting proxy it is what
    lets pip and curl inside the build verify TLS)."""
    if value in (None, "auto"):
        return DEFAULT_CA if Path(DEFAULT_CA).exists() else None
    if value == "none":
        return None
    if not Path(value).is_file():
        raise TrainbaseError(f"--ca-bundle {value}: no such file")
    return value


def command(
    j: Job,
    namespace: str,
    base_refs: dict[str, str],
    ca: str | None,
    network: str | None,
    no_cache: bool,
    root: Path = Path("."),
) -> tuple[list[str], dict[str, str]]:
    """The build command of ``j`` and its environment. ``base_refs``: each row's base -> what
    it is built FROM here (official or bootstrap)."""
    return buildkit.build_command(
        j.rendered.dockerfile,
        j.image,
        labels={
            "io.trainbase.recipe": j.rendered.recipe,
            "org.opencontainers.image.version": j.tag,
            **source_labels(str(root)),
            **base_labels(j, base_refs),
        },
        build_args={"TRAINBASE_NAMESPACE": namespace, **base_arg(j, base_refs)},
        target=None if j.parent else "image",
        secrets={"ca_bundle": ca} if ca else None,
        network=network,
        no_cache=no_cache,
        platform=j.cell.platform,
    )


@functools.cache
def source_labels(root: str) -> dict[str, str]:
    """OCI ``source``/``revision``/``created``: where the recipe lives, the commit it was built
    from, when. Read once per run: CI's repository URL (GITHUB_SERVER_URL/GITHUB_REPOSITORY),
    else the checkout's origin without any credentials in it; HEAD of the checkout. Labels are
    not part of the recipe (the tag stays the recipe's), so they never cause a rebuild."""
    out = {"org.opencontainers.image.created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}

    def git(*args: str) -> str:
        r = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, check=False)
        return r.stdout.strip() if r.returncode == 0 else ""

    if os.environ.get("GITHUB_REPOSITORY"):
        source = f"{os.environ.get('GITHUB_SERVER_URL', 'https://github.com')}/{os.environ['GITHUB_REPOSITORY']}"
    else:
        source = re.sub(r"//[^/@]*@", "//", git("config", "--get", "remote.origin.url"))
    if source and not source.startswith("/"):  # a local path is nobody's source
        out["org.opencontainers.image.source"] = source
    revision = os.environ.get("GITHUB_SHA") or git("rev-parse", "HEAD")
    if revision:
        out["org.opencontainers.image.revision"] = revision
    return out


def base_labels(j: Job, base_refs: dict[str, str]) -> dict[str, str]:
    """A root cell records the base it is built FROM (ref, identity, how) in its labels;
    children inherit them. The supply step reads them back for cached and pulled tags."""
    if j.parent:
        return {}
    os_ = j.rendered.context.data["os"]
    return bases.base_labels(bases.base_identity(base_refs.get(os_["base_key"], os_["base"])))


def base_arg(j: Job, base_refs: dict[str, str]) -> dict[str, str]:
    """TRAINBASE_BASE for a base cell of a row whose Dockerfile takes its base as an argument."""
    os_ = j.rendered.context.data["os"]
    if j.parent or not os_.get("bootstrappable"):
        return {}
    return {"TRAINBASE_BASE": base_refs.get(os_["base_key"], os_["base"])}


def check_space(builds: int, min_free_gb: float) -> None:
    """Refuse to start ``builds`` builds with less than ``min_free_gb`` free where the engine
    keeps its images."""
    root = _docker_root()
    free = shutil.disk_usage(root).free / 1e9 if root and Path(root).exists() else None
    if free is not None and free < min_free_gb:
        raise TrainbaseError(
            f"only {free:.1f} GB free under {root}; building {builds} image(s) needs "
            f"at least {min_free_gb:g} GB (prune with `docker system prune`, or "
            f"lower the bar with --min-free-gb)"
        )


def _docker_root() -> str | None:
    try:
        return engine.info().root_dir or None
    except engine.EngineError:
        return None


_ERROR_LINE = re.compile(r"(?i)(error|failed|no space left|denied|not found|mismatch|refusing|assert)")


def failure_reason(tail: list[str], rc: int) -> str:
    """The most telling line of a failed build's log: the last line that looks like an error."""
    for s in reversed(tail):
        if "no space left on device" in s.lower():
            return "no space left on device (free disk space or prune the build cache)"
    # only the failed step's lines (and the plain lines after it): an earlier step's output,
    # such as "tb-entrypoints: ... wrappers in /usr/local/bin", is not why the build failed
    failed = next((m.group(1) for s in reversed(tail) if (m := re.match(r"^#(\d+) ERROR", s))), None)
    if failed:
        tail = [s for s in tail if s.startswith(f"#{failed} ") or not re.match(r"^#\d+ ", s)]
    noise = re.compile(r"^(#\d+ )?(ERROR: )?(executor failed|failed to solve|------|> \[|\[.*\] RUN )")
    lines = [re.sub(r"^#\d+ [\d.]+ ", "", s) for s in tail if not noise.match(s)]
    for pattern in (r"ERROR: |mismatch|refusing|tb-\S+: ", r"(?i)\berror\b", _ERROR_LINE.pattern):
        for s in reversed(lines):
            if re.search(pattern, s) and not re.fullmatch(r"(?i)error: subprocess-exited-with-error", s.strip()):
                return s.strip()[:300]
    return f"docker build exited {rc}" + (f": {tail[-1][:200]}" if tail else "")
