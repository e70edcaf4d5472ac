"""Reading inputs strictly and writing records atomically (issue 64).

``atomic_write`` writes a temporary file in the target's directory, fsyncs it and renames it over
the target, so a kill or a full disk leaves the old file or the new one, never a truncated one.
``load_yaml`` refuses duplicate mapping keys (PyYAML keeps the last one silently) and
``read_text`` refuses a file that is not UTF-8; both raise ``InputError`` naming the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml


class InputError(ValueError):
    """An input file that cannot be read as what it should be; the message names the file."""


def atomic_write(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Replace PATH's content with DATA (text is written as UTF-8) all at once: a temporary file in
    the same directory, flushed and fsynced, then ``os.replace``. The directory must exist. An
    error (ENOSPC, a kill) leaves PATH as it was and no temporary file behind."""
    p = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    if p.exists() and not p.is_file():
        # a device or a pipe (`--report /dev/null`, `/dev/stdout`): written to, never replaced --
        # a rename over /dev/null once turned it into a regular file and broke every program
        # that reads it as empty (git: "bad config line 1 in file /dev/null")
        with open(p, "wb") as f:
            f.write(raw)
        return
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name[:64]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(OSError):  # keep the target's mode (a rendered script stays executable)
            os.chmod(tmp, p.stat().st_mode & 0o7777)
        if not p.exists():
            os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself durable (best effort: not every FS allows it)
        dfd = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _read_umask() -> int:
    mask = os.umask(0o022)  # read once, at import (umask cannot be read without setting it)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def read_text(path: str | os.PathLike[str]) -> str:
    """PATH's text; InputError when it is not UTF-8 (FileNotFoundError passes through)."""
    p = Path(path)
    try:
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{p}: not UTF-8 text (byte {e.start}: {e.reason})") from None


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping naming one key twice."""


def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        with contextlib.suppress(TypeError):  # an unhashable key: construct_mapping says so
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"duplicate key {key!r} (first on line {seen[key] + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def yaml_problem(e: yaml.YAMLError) -> str:
    """`line L, column C: problem` of a YAML error, on one line."""
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(e, "problem", None) or (str(e).splitlines() or ["?"])[0]
    return f"{where}{problem}"


def load_yaml(path: str | os.PathLike[str], loader: type[yaml.SafeLoader] = UniqueKeyLoader) -> Any:
    """PATH as YAML, refusing duplicate keys and non-UTF-8 text (InputError naming the file)."""
    text = read_text(path)
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 -- a SafeLoader
    except yaml.YAMLError as e:
        raise InputError(f"{path}: malformed YAML: {yaml_problem(e)}") from None


def load_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """PATH as a JSON object; InputError (naming the file and the cause) for anything else,
    e.g. the empty or truncated file a kill or a full disk left."""
    text = read_text(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        if not text.strip():
            what = "empty"
        elif e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string"):
            # the parser wanted more where the text ends: what a killed writer or a full disk leaves
            what = f"cut short (its JSON ends unfinished at line {e.lineno}, column {e.colno})"
        else:
            what = f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        raise InputError(f"{path}: {what}") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: must be a JSON object, got {type(doc).__name__}")
    return doc


def load_record(path: str | os.PathLike[str], what: str, shape: dict[str, type | tuple[type, ...]]) -> dict[str, Any]:
    """PATH as the JSON object a record of another run is (``what``: "a build report"), with each
    key of ``shape`` there and of its type; InputError naming the file, what it should be and the
    first thing wrong (empty, cut short, not JSON, the wrong shape) -- one line, never a traceback."""
    try:
        doc = load_json_object(path)
    except InputError as e:
        raise InputError(f"{e}: not {what}") from None
    for key, kind in shape.items():
        if key not in doc:
            raise InputError(f"{path}: not {what}: it has no {key!r}")
        if not isinstance(doc[key], kind):
            want = " or ".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
            raise InputError(f"{path}: not {what}: {key!r} is {type(doc[key]).__name__}, not {want}")
    return doc
