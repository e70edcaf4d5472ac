"""Bad input never gives a traceback: a one-line reason and exit code 2."""

import copy

import pytest
import yaml

from .conftest import run_cli


def _set(d: dict, path: str, value):
    keys = path.split("/")
    for k in keys[:-1]:
        d = d[int(k)] if isinstance(d, list) else d[k]
    if value is _DELETE:
        del d[keys[-1]]
    else:
        d[int(keys[-1]) if isinstance(d, list) else keys[-1]] = value


_DELETE = object()

# (id, mutation path, value, expected words in the one-line message)
MUTATIONS = [
    ("unknown-top-level-key", "axis", {"os": ["debian12"]}, "axis: unknown key"),
    ("unknown-nested-key", "os/debian12/pyton", {"version": "3.11"}, "os.debian12.pyton: unknown key"),
    ("unknown-axis-value", "axes/cuda", ["12.8", "11.8"], "axes.cuda: value '11.8' has no entry in the cuda table"),
    (
        "artifact-without-checksum",
        "artifacts/openmpi-4.1.8/sha256",
        _DELETE,
        "artifacts.openmpi-4.1.8: pin an artifact by exactly one of sha256",
    ),
    ("artifact-bad-checksum", "artifacts/ucx-1.20.1/sha256", "abc123", "is not 64 lowercase hex digits"),
    ("pending-without-reason", "artifacts/ucx-1.20.1/sha256", "pending", "'pending' without a pending_reason"),
    (
        "key-short-id",
        "artifacts/doca-gpg-key/openpgp_fingerprint",
        "E6D6A281",
        "is not a 40-digit fingerprint or a 16-digit long key ID",
    ),
    (
        "tarball-pinned-by-key",
        "artifacts/ucx-1.20.1",
        {
            "url": "https://github.com/openucx/ucx/releases/download/v1.20.1/ucx-1.20.1.tar.gz",
            "openpgp_fingerprint": "CAE649B3B3929F8470D4D33BA024F6F0E6D6A281",
        },
        "only a repository signing key (ib.*.key) may be; pin this file by sha256",
    ),
    (
        "moving-url",
        "artifacts/ucx-1.20.1/url",
        "https://github.com/openucx/ucx/archive/refs/heads/master.tar.gz",
        "moving target",
    ),
    ("rule-unknown-axis", "rules/0/when", {"gpu": "a100"}, "unknown axis 'gpu'"),
    ("rule-unknown-value", "rules/0/require", {"os": ["ubuntu26.04"]}, "unknown value 'ubuntu26.04'"),
    ("unpinned-pip", "frameworks/pytorch/releases/0/packages", ["torch>=2.9"], "not pinned as NAME==VERSION"),
    # a version no matrix will declare, so adding a CUDA row (any real one) leaves this test alone
    ("unknown-cuda-in-release", "frameworks/pytorch/releases/0/cuda", ["0.1"], "unknown CUDA version '0.1'"),
    (
        "cuda-library-a-row-lacks",
        "frameworks/tensorflow/releases/0/cuda_libraries",
        ["cufft", "cudss"],
        "frameworks.tensorflow.releases[2.21.0].cuda_libraries: CUDA 12.8 declares no cudss in cuda.12.8.libraries",
    ),
    ("base-latest", "os/debian12/base", "debian:latest", "must be pinned to a release tag"),
    ("unknown-artifact-ref", "mpi/openmpi4.1.8/artifact", "openmpi-9.9.9", "unknown artifact 'openmpi-9.9.9'"),
    ("source-without-artifact", "mpi/openmpi4.1.8/artifact", _DELETE, "install: source needs an artifact"),
    ("profile-unknown-cell", "profiles/local/cells", ["openmpi9.9-cuda12.8-cudnn9-debian12"], "no such cell"),
    (
        "profile-excluded-cell",
        "profiles/local/cells",
        ["openmpi4.1.4-doca3.2-cuda12.8-cudnn9-debian12"],
        "excluded: rule doca-on-ubuntu",
    ),
    ("unknown-parent", "frameworks/horovod/parent", "mxnet", "unknown framework 'mxnet'"),
    ("patch-checksum-mismatch", "frameworks/horovod/releases/0/patch/sha256", "0" * 63 + "1", "matrix.yaml pins"),
    ("wrong-schema-version", "schema_version", 2, "schema_version"),
    ("nccl-wheel-disagrees", "cuda/12.8/nccl", "2.26.2", "differs from the NCCL wheel"),
]


@pytest.mark.parametrize("case, path, value, expected", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_malformed_matrix_is_rejected_with_one_line(workdir, matrix_data, capsys, case, path, value, expected):
    data = copy.deepcopy(matrix_data)
    _set(data, path, value)
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    code, out, err = run_cli(["list", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: matrix.yaml") and expected in lines[0], lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "text, expected",
    [
        ("axes: [unclosed\n", "malformed YAML"),
        ("- just\n- a list\n", "top level must be a mapping"),
        ("", "top level must be a mapping"),
    ],
)
def test_unparseable_matrix(workdir, capsys, text, expected):
    (workdir / "matrix.yaml").write_text(text)
    code, _, err = run_cli(["check", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1


def test_missing_matrix_file(tmp_path, capsys):
    code, _, err = run_cli(["list", "--file", str(tmp_path / "nope.yaml")], capsys)
    assert code == 2 and "file not found" in err


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--select", "os=debian12", "--select", "ib=doca"], "matches no cell"),
        (["--select", "gpu=a100"], "unknown key"),
        (["--select", "cuda=11.8"], "unknown value"),
        (["--select", "noequals"], "expected KEY=VALUE"),
        (["--profile", "nightly"], "unknown profile 'nightly'"),
    ],
)
def test_bad_selection(workdir, capsys, args, expected):
    code, _, err = run_cli(["list", "--file", str(workdir / "matrix.yaml"), *args], capsys)
    assert code == 2 and expected in err


def test_template_undefined_variable_names_template_and_line(workdir, capsys):
    p = workdir / "templates" / "blocks" / "nccl.j2"
    p.write_text(p.read_text().replace("{{ nccl.version }}", "{{ nccl.versoin }}", 1))
    code, _, err = run_cli(["render", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code == 2
    assert "template blocks/nccl.j2 line" in err and "versoin" in err
    assert len(err.strip().splitlines()) == 1


def test_template_syntax_error_names_template_and_line(workdir, capsys):
    p = workdir / "templates" / "blocks" / "ucx.j2"
    p.write_text(p.read_text() + "\n{% if %}\n")
    code, _, err = run_cli(["render", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code == 2 and "ucx.j2 line" in err


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`build.py --list | head -1`: the pipe closes, the command ends quietly (141, as SIGPIPE)."""
    import subprocess
    import sys

    from .conftest import ROOT

    p = subprocess.run(  # noqa: S602 -- the case is a shell pipe closed early
        f"{sys.executable} build.py --list --all | head -1",
        shell=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        executable="/bin/bash",
        check=False,
    )
    assert p.stdout.count("\n") == 1 and "Traceback" not in p.stderr and "BrokenPipeError" not in p.stderr, p.stderr


# --------------------------------------------------------------------------- issue 64: bad input


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _snapshot(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("jobs", ["0", "-3"])
def test_jobs_below_one_is_refused(workdir, capsys, jobs):
    code, _, err = run_cli(["build", "--file", str(workdir / "matrix.yaml"), "-j", jobs, "--dry-run"], capsys)
    assert code == 2 and "-j/--jobs" in _one_line(err) and jobs in err


def test_an_empty_profile_selects_nothing_rather_than_everything(workdir, capsys):
    code, out, err = run_cli(["build", "--file", str(workdir / "matrix.yaml"), "--profile", "", "--dry-run"], capsys)
    assert code == 2 and "unknown profile ''" in _one_line(err), out


@pytest.mark.parametrize(
    "base, expected",
    [
        ("{mpi}{bogus}-{os}", "naming.base: unknown field {bogus}"),
        ("{mpi}{ib_tag-cuda{cuda}", "naming.base: "),
        ("{mpi}}-{os}", "naming.base: "),
    ],
)
def test_a_bad_naming_pattern_is_one_line(workdir, matrix_data, capsys, base, expected):
    matrix_data["naming"]["base"] = base
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(matrix_data, sort_keys=False))
    before = _snapshot(workdir)
    code, _, err = run_cli(["render", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code == 2 and expected in _one_line(err) and err.startswith("error: matrix.yaml")
    assert _snapshot(workdir) == before


@pytest.mark.parametrize(
    "base, expected",
    [
        ("../../escaped-{mpi}{ib_tag}-cuda{cuda}-cudnn{cudnn_major}-{os}", "not a safe name"),
        ("sub/{mpi}{ib_tag}-cuda{cuda}-cudnn{cudnn_major}-{os}", "not a safe name"),
        ("a" * 300 + "{mpi}{ib_tag}-cuda{cuda}-cudnn{cudnn_major}-{os}", "longer than"),
    ],
)
def test_a_cell_name_must_be_one_safe_path_component(tmp_path, matrix_data, capsys, base, expected):
    from ..conftest import copy_inputs

    (tmp_path / "checkout").mkdir()
    checkout = copy_inputs(tmp_path / "checkout")
    matrix_data["naming"]["base"] = base
    (checkout / "matrix.yaml").write_text(yaml.safe_dump(matrix_data, sort_keys=False))
    before = _snapshot(tmp_path)
    code, _, err = run_cli(["render", "--file", str(checkout / "matrix.yaml")], capsys)
    line = _one_line(err)
    assert code == 2 and expected in line and line.startswith("error: matrix.yaml: naming"), line
    assert _snapshot(tmp_path) == before  # nothing written, inside the checkout or outside it


def test_a_non_utf8_matrix_is_refused(workdir, capsys):
    p = workdir / "matrix.yaml"
    p.write_bytes(p.read_bytes().replace(b"naming:", b"# caf\xe9\nnaming:", 1))
    code, _, err = run_cli(["list", "--file", str(p)], capsys)
    assert code == 2 and "not UTF-8" in _one_line(err) and "matrix.yaml" in err


def test_a_duplicate_key_in_the_matrix_is_refused(workdir, capsys):
    p = workdir / "matrix.yaml"
    p.write_text(p.read_text().replace("naming:\n", "schema_version: 1\nnaming:\n", 1))
    code, _, err = run_cli(["list", "--file", str(p)], capsys)
    assert code == 2 and "duplicate key 'schema_version'" in _one_line(err)


def test_a_duplicate_key_in_the_allowlist_is_refused(tmp_path):
    from trainbase.supply import audit

    p = tmp_path / "allow.yaml"
    p.write_text("- id: CVE-1\n  id: CVE-2\n  package: x\n  reason: r\n  expires: 2099-01-01\n")
    with pytest.raises(audit.AuditError, match="duplicate key 'id'"):
        audit.load_allowlist(p)


@pytest.mark.parametrize("text", ["[]", "", '{"schema": 1, "bas', "null"])
def test_a_broken_bases_lock_is_one_line(workdir, capsys, text):
    (workdir / "locks" / "bases.json").write_text(text)
    code, _, err = run_cli(["render", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code == 2 and "locks/bases.json" in _one_line(err)


@pytest.mark.parametrize("text", ["", '{"cells": {"x": ', "[1]"])
def test_a_truncated_catalogue_record_is_one_line(workdir, capsys, text):
    (workdir / "docs").mkdir(exist_ok=True)
    (workdir / "docs" / "catalogue-record.json").write_text(text)
    code, _, err = run_cli(["render", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code == 2 and "catalogue-record.json" in _one_line(err)


@pytest.mark.parametrize("text", ["", '{"schema": 1, "inp', "[]"])
def test_locked_over_an_unreadable_input_lock_names_the_file(tmp_path, text):
    import io

    from trainbase.define.matrix import load
    from trainbase.errors import TrainbaseError
    from trainbase.render import recipes
    from trainbase.run import executor
    from trainbase.supply import chain

    from .conftest import ROOT

    m = load(ROOT / "matrix.yaml")
    cell = m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12")
    rendered = recipes.render_all(m, [cell], root=ROOT)
    b = executor.Executor(m, rendered, [cell], executor.Options(ca_bundle="none"), ROOT, out=io.StringIO())
    sc = chain.SupplyChain(ROOT, chain.SupplyOptions(dir=tmp_path, locked=True), {}, rendered)
    j = b.jobs[cell.name]
    sc.cell_dir(j).mkdir(parents=True)
    (sc.cell_dir(j) / "inputs.lock.json").write_text(text)
    with pytest.raises(
        TrainbaseError, match=r"inputs\.lock\.json: .*(empty|cut short|not valid JSON|JSON object)"
    ) as e:
        sc.check_inputs(j)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- issue 64: atomic records


def _full_disk_after(monkeypatch, nbytes: int) -> list[str]:
    """Every atomic write fails with ENOSPC after NBYTES of its temporary file: a full disk."""
    import errno
    import os

    from trainbase_common import safe_io

    real = os.fdopen
    tried: list[str] = []

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            tried.append(self.f.name)
            self.f.write(data[:nbytes])
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(safe_io.os, "fdopen", lambda fd, mode="r", *a, **k: Full(real(fd, mode, *a, **k)))
    return tried


def test_a_full_disk_under_render_leaves_the_old_files_intact(workdir, monkeypatch, capsys):
    p = workdir / "matrix.yaml"
    p.write_text(p.read_text().replace("namespace: trainbase", "namespace: trainbase2", 1))
    images = workdir / "images"
    before = _snapshot(images)
    tried = _full_disk_after(monkeypatch, 100)
    code, _, err = run_cli(["render", "--file", str(p)], capsys)
    assert tried, "render wrote nothing through the atomic writer"
    assert code == 1 and "No space left on device" in _one_line(err)
    assert _snapshot(images) == before  # every old file whole, and no temporary file left behind


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path, monkeypatch):
    from trainbase_common import safe_io

    p = tmp_path / "record.json"
    p.write_text('{"old": true}\n')
    p.chmod(0o755)
    safe_io.atomic_write(p, '{"new": true}\n')
    assert p.read_text() == '{"new": true}\n' and p.stat().st_mode & 0o777 == 0o755
    _full_disk_after(monkeypatch, 3)
    with pytest.raises(OSError, match="No space"):
        safe_io.atomic_write(p, b'{"newer": true}\n')
    assert p.read_text() == '{"new": true}\n' and [q.name for q in tmp_path.iterdir()] == ["record.json"]


# --------------------------------------------------------------------------- issue 64: one run per checkout


def test_a_second_writing_run_is_refused_while_one_holds_the_checkout(workdir, capsys):
    import os
    import subprocess
    import sys

    from trainbase.cli import checkout_lock

    from .conftest import ROOT

    holder = subprocess.Popen(  # another process (flock is per open file: a thread would not do)
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from trainbase.cli import checkout_lock as c\n"
            "with c.hold(Path(sys.argv[1]), ['build.py', 'build', '--profile', 'local']):\n"
            "    print('held', flush=True); time.sleep(60)",
            str(workdir),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        before = _snapshot(workdir / "images")
        for cmd in (["render"], ["build", "--profile", "local"], ["lock-bases"], ["catalogue"]):
            code, _, err = run_cli([*cmd, "--file", str(workdir / "matrix.yaml")], capsys)
            line = _one_line(err)
            assert code == 2, (cmd, err)
            assert (
                f"another trainbase run holds this checkout: pid {holder.pid} (command build.py build --profile local)"
                in line
            )
        assert _snapshot(workdir / "images") == before
        # reading commands and dry runs still run beside it
        assert run_cli(["list", "--file", str(workdir / "matrix.yaml")], capsys)[0] == 0
        assert (
            run_cli(["build", "--dry-run", "--profile", "local", "--file", str(workdir / "matrix.yaml")], capsys)[0]
            == 0
        )
    finally:
        holder.kill()
        holder.wait()
    code, _, err = run_cli(["render", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code == 0, err  # the kernel dropped the killed holder's lock: nothing stale to clean up
    assert checkout_lock.lock_path(workdir).read_text().startswith(f"{os.getpid()}\nbuild.py render --file ")


def test_run_ids_are_unique_within_one_second():
    import io

    from trainbase.define.matrix import load
    from trainbase.render import recipes
    from trainbase.run import executor

    from .conftest import ROOT

    m = load(ROOT / "matrix.yaml")
    cell = m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12")
    rendered = recipes.render_all(m, [cell], root=ROOT)
    ids = {
        executor.Executor(m, rendered, [cell], executor.Options(ca_bundle="none"), ROOT, out=io.StringIO()).run_id
        for _ in range(20)
    }
    assert len(ids) == 20


def test_atomic_write_writes_to_a_device_and_never_replaces_it(tmp_path):
    """`--report /dev/null` once renamed a regular file over /dev/null (git then read it as a config
    with a bad line 1): a device or a pipe is written to, and stays what it was."""
    import os
    import stat

    from trainbase_common.safe_io import atomic_write

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        atomic_write(fifo, "report\n")
        assert os.read(reader, 100) == b"report\n"
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(fifo.stat().st_mode), "the pipe was replaced by a regular file"
    atomic_write(os.devnull, "{}\n")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode), "/dev/null was replaced by a regular file"
