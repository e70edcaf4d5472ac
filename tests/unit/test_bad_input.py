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
    ("unknown-cuda-in-release", "frameworks/pytorch/releases/0/cuda", ["12.6"], "unknown CUDA version '12.6'"),
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
