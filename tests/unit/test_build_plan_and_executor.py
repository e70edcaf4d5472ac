"""The build scheduler without an engine: dependency order, parallelism, failure isolation,
refusals, the plan, and how registry answers are read (present, absent, or an error)."""

import io
import re
import time

import pytest

from trainbase.build import docker_build, plan
from trainbase.define.matrix import load, parse_selects
from trainbase.deliver import registry
from trainbase.errors import TrainbaseError
from trainbase.render import recipes
from trainbase.run import executor
from trainbase.run.report import build_report
from trainbase_common import buildkit, engine
from trainbase_common.states import JobState

from ..conftest import cell
from .conftest import ROOT

# the 12.8 row's PyTorch on Ubuntu 24.04 over Open MPI 4.1.8 (its base uses the pending artifact)
PYTORCH_UBUNTU_128 = cell(os="ubuntu24.04", cuda="12.8", mpi="openmpi4.1.8", ib="inbox", framework="pytorch")


@pytest.fixture(scope="module")
def m():
    return load(ROOT / "matrix.yaml")


def make(m, names, fail=(), jobs=2, monkeypatch=None, **kw):
    cells = [m.cell(n) for n in names]
    rendered = recipes.render_all(m, cells, root=ROOT)
    b = executor.Executor(
        m, rendered, cells, executor.Options(jobs=jobs, ca_bundle="none", **kw), ROOT, out=io.StringIO()
    )
    log: list[tuple[str, str, float]] = []

    def fake_build(job):
        log.append(("start", job.name, time.monotonic()))
        job.started = time.monotonic()
        time.sleep(0.05)
        job.ended = time.monotonic()
        job.status, job.reason = (JobState.FAILED, "boom") if job.name in fail else (JobState.BUILT, None)
        log.append(("end", job.name, time.monotonic()))

    monkeypatch.setattr(engine, "available", lambda: True)
    monkeypatch.setattr(engine, "image_exists", lambda ref: False)
    monkeypatch.setattr(b, "ensure_bases", lambda: None)
    monkeypatch.setattr(b, "check_space", lambda: None)
    monkeypatch.setattr(b, "_inspect", lambda job: None)
    monkeypatch.setattr(b, "build_one", fake_build)
    return b, log


LOCAL = [
    "horovod0.28.1-pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12",
    "deepspeed0.19.8-pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12",
    "intelmpi2021.18-cuda12.8-cudnn9-debian12",
]


def test_parents_are_added_and_built_first(m, monkeypatch):
    b, log = make(m, LOCAL, monkeypatch=monkeypatch)
    order = list(b.jobs)
    assert order[0] == "openmpi4.1.4-cuda13.2-cudnn9-debian12"  # what the first selected cell needs
    assert len(order) == 5 and order.index("pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12") < order.index(
        LOCAL[0]
    )
    assert not b.jobs["openmpi4.1.4-cuda13.2-cudnn9-debian12"].selected
    assert b.run() == 0
    ends = {n: t for ev, n, t in log if ev == "end"}
    starts = {n: t for ev, n, t in log if ev == "start"}
    for j in b.jobs.values():
        if j.cell.parent:
            assert starts[j.name] >= ends[j.cell.parent]


def test_builds_run_in_parallel_up_to_j(m, monkeypatch):
    b, log = make(m, LOCAL, jobs=2, monkeypatch=monkeypatch)
    b.run()
    running = peak = 0
    for ev, _, _ in sorted(log, key=lambda e: e[2]):
        running += 1 if ev == "start" else -1
        peak = max(peak, running)
    assert peak == 2


def test_a_failure_skips_dependents_only(m, monkeypatch):
    b, _ = make(m, LOCAL, fail={"pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12"}, monkeypatch=monkeypatch)
    assert b.run() == 1
    st = {n: (j.status, j.reason) for n, j in b.jobs.items()}
    assert st["pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12"][0] == "failed"
    for child in LOCAL[:2]:
        assert st[child][0] == "skipped" and "pytorch2.15.0-openmpi4.1.4" in st[child][1]
    assert st["intelmpi2021.18-cuda12.8-cudnn9-debian12"][0] == "built"
    report = build_report(b)
    assert report["counts"] == {"built": 2, "failed": 1, "skipped": 2}


@pytest.fixture(scope="module")
def m_pending(tmp_path_factory):
    """matrix.yaml with Open MPI 4.1.8's tarball checksum not yet verified ('pending')."""
    d = tmp_path_factory.mktemp("pending")
    text = (ROOT / "matrix.yaml").read_text()
    pinned = "    sha256: 466f68e3132a1dc02710cc2011fafced8336d98359fa2dae4dddcfd5719f12a9"
    assert pinned in text
    (d / "matrix.yaml").write_text(text.replace(pinned, "    sha256: pending\n    pending_reason: not yet verified", 1))
    (d / "patches").symlink_to(ROOT / "patches")
    return load(d / "matrix.yaml")


def test_pending_artifact_refuses_the_cell_before_building(m_pending, monkeypatch):
    b, log = make(m_pending, [PYTORCH_UBUNTU_128], monkeypatch=monkeypatch)
    assert b.run() == 1
    base = b.jobs["openmpi4.1.8-cuda12.8-cudnn9-ubuntu24.04"]
    assert base.status == "refused" and "openmpi-4.1.8 has no verified sha256 (not yet verified)" in base.reason
    assert b.jobs[PYTORCH_UBUNTU_128].status == "skipped"
    assert log == []


def test_doca_cells_are_not_refused_their_key_is_pinned_by_fingerprint(m, monkeypatch):
    # (the arm64 DOCA rows are refused for another reason: Miniforge's aarch64 installer is pending)
    cells = m.select(parse_selects(["ib=doca", "platform=linux/amd64"]))
    b, log = make(m, [c.name for c in cells], dry_run=True, monkeypatch=monkeypatch)
    monkeypatch.setattr(engine, "available", lambda: False)
    assert b.run() == 0 and log == []
    assert not [j.name for j in b.jobs.values() if j.status == "refused"]
    assert "REFUSED" not in b.out.getvalue()


def test_dry_run_plan_shows_levels_sharing_and_refusals(m_pending, monkeypatch):
    """The plan a person reads before an hour of builds: FROM levels, the os/ib stage the base
    cells share (built once), and each refused cell with its reason; nothing is built."""
    cells = m_pending.select(parse_selects(["os=debian12", "cuda=12.8,13.2", "mpi=openmpi4.1.4"]))
    names = [c.name for c in cells] + ["intelmpi2021.18-cuda12.8-cudnn9-debian12", PYTORCH_UBUNTU_128]
    b, log = make(m_pending, names, dry_run=True, monkeypatch=monkeypatch)
    monkeypatch.setattr(engine, "available", lambda: False)
    assert b.run() == 0 and log == []  # a plan builds nothing, refused cells included
    out = b.out.getvalue()
    assert "step 1:" in out and "step 2:" in out and "step 3:" in out
    assert "FROM openmpi4.1.4-cuda12.8-cudnn9-debian12" in out
    shared = [
        ln for ln in out.splitlines() if ln.strip().startswith("shared os/ib stage (built once):") and "arm64" not in ln
    ]
    assert (
        len(shared) == 1
        and "openmpi4.1.4-cuda12.8-cudnn9-debian12" in shared[0]
        and "intelmpi2021.18-cuda12.8-cudnn9-debian12" in shared[0]
    ), out
    assert re.search(
        r"REFUSED\s+\S+openmpi4\.1\.8-cuda12\.8-cudnn9-ubuntu24\.04:\S+[^\n]*\n\s+artifact openmpi-4\.1\.8 "
        r"has no verified sha256",
        out,
    ), out
    assert re.search(
        rf"skip\s+\S+{re.escape(PYTORCH_UBUNTU_128)}\S+[^\n]*\n\s+its parent openmpi4\.1\.8-\S+ refused", out
    ), out


def test_stage_groups_share_the_os_stage(m):
    """Pure plan: base cells with the same OS, CUDA base and IB row render the same os stage."""
    names = [
        "openmpi4.1.4-cuda12.8-cudnn9-debian12",
        "intelmpi2021.18-cuda12.8-cudnn9-debian12",
        "openmpi5.0.11-cuda13.0-cudnn9-debian12",
        "openmpi4.1.8-cuda12.8-cudnn9-ubuntu24.04",
    ]
    cells = [m.cell(n) for n in names]
    p = plan.Plan(m, recipes.render_all(m, cells, root=ROOT), cells)
    groups = sorted(sorted(g) for g in p.stage_groups().values())
    assert sorted(names[:3]) in groups and ["openmpi4.1.8-cuda12.8-cudnn9-ubuntu24.04"] in groups


def test_plan_orders_parents_first_and_skips_children_of_a_failure_in_one_pass(m):
    """Pure plan: graph order (graphlib), a cached predicate, and skip propagation down two levels."""
    top = m.cell("horovod0.28.1-pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12")
    p = plan.Plan(m, recipes.render_all(m, [top], root=ROOT), [top])
    assert list(p.jobs) == [
        "openmpi4.1.4-cuda13.2-cudnn9-debian12",
        "pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12",
        top.name,
    ]
    assert p.levels() == {n: i for i, n in enumerate(p.jobs)}
    p.mark_cached(lambda ref: ref.startswith("trainbase/openmpi4.1.4-"))
    assert [j.status for j in p.jobs.values()] == [JobState.CACHED, JobState.QUEUED, JobState.QUEUED]
    assert [j.name for j in p.ready()] == ["pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12"]
    p.jobs["pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12"].status = JobState.FAILED
    p.propagate()
    assert p.jobs[top.name].status == JobState.SKIPPED and "pytorch2.15.0" in p.jobs[top.name].reason


def test_command_passes_the_ca_as_a_secret_and_targets_the_image_stage(m, monkeypatch, tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    monkeypatch.setattr(buildkit, "build_cli", lambda: "/usr/bin/docker")
    cells = [m.cell("openmpi4.1.4-cuda12.8-cudnn9-debian12")]
    b = executor.Executor(
        m, recipes.render_all(m, cells, root=ROOT), cells, executor.Options(ca_bundle=str(ca), network="host"), ROOT
    )
    cmd, env = b.command(b.jobs[cells[0].name])
    assert env["DOCKER_BUILDKIT"] == "1"
    assert ["--secret", f"id=ca_bundle,src={ca}"] == cmd[cmd.index("--secret") : cmd.index("--secret") + 2]
    assert "--target" in cmd and cmd[cmd.index("--target") + 1] == "image"
    assert cmd[cmd.index("-t") + 1] == b.jobs[cells[0].name].image
    assert "--network" in cmd and cmd[-1] == "."


def test_missing_ca_bundle_is_bad_input():
    with pytest.raises(TrainbaseError, match="no such file"):
        docker_build.ca_bundle("/nonexistent/ca.pem")


@pytest.mark.parametrize(
    "tail, expected",
    [
        (
            [
                "#14 12.0 tb-fetch: sha256 mismatch for http://x: expected a, got b",
                "#14 ERROR: process did not complete",
            ],
            "ERROR: process did not complete",
        ),
        (["write /var/lib/docker/x: no space left on device"], "no space left on device"),
        ([], "docker build exited 1"),
    ],
)
def test_failure_reason_picks_the_telling_line(tail, expected):
    assert expected in docker_build.failure_reason(tail, 1)


@pytest.mark.parametrize("bad", ["127.0.0.1:5000", "/trainbase", "host:5000/Upper"])
def test_registry_argument_is_checked(bad):
    with pytest.raises(TrainbaseError, match="HOST"):
        registry.split_registry(bad)


@pytest.mark.parametrize(
    "status, text, expected",
    [
        (200, "", "present"),
        (404, "manifest unknown: manifest unknown", "absent"),
        # what the engine says for an anonymous request to a registry that wants a login (seen
        # against distribution with htpasswd), for wrong credentials, and for a read-only token
        (500, 'Head "https://ghcr.io/v2/o/x/manifests/r1": no basic auth credentials', registry.RegistryAuthError),
        (401, "unauthorized: authentication required", registry.RegistryAuthError),
        (403, "denied: permission_denied: write_package", registry.RegistryAuthError),
        (500, 'Get "https://ghcr.io/v2/": dial tcp: lookup ghcr.io: no such host', registry.RegistryError),
        # issue 64: digits in a server error's body are not a status; the status it quotes is
        (
            500,
            "received unexpected HTTP status: 500 Internal Server Error (request id 4031-9a)",
            registry.RegistryError,
        ),
        (
            500,
            'Head "https://ghcr.io/v2/o/x/manifests/r1": unexpected status code 503 Service Unavailable: 403',
            registry.RegistryError,
        ),
        (
            500,
            "unexpected status from HEAD request to https://ghcr.io/v2/o/x/manifests/r1: 401 Unauthorized",
            registry.RegistryAuthError,
        ),
    ],
)
def test_registry_answers_are_present_absent_or_an_error_never_unknown(monkeypatch, status, text, expected):
    def distribution_digest(ref):
        assert ref == "ghcr.io/o/x:r1"
        if status == 200:
            return "sha256:" + "0" * 64
        raise engine.EngineAPIError(status, f"{status} {text}")  # what the adapter raises from the SDK's APIError

    monkeypatch.setattr(engine, "distribution_digest", distribution_digest)
    if isinstance(expected, str):
        assert registry.tag_state("ghcr.io", "o/x", "r1") == expected
        return
    with pytest.raises(expected) as e:
        registry.tag_state("ghcr.io", "o/x", "r1")
    if expected is registry.RegistryAuthError:
        assert "docker login ghcr.io" in str(e.value) and "write:packages" in str(e.value)
    else:
        assert not isinstance(e.value, registry.RegistryAuthError) and "could not say whether" in str(e.value)


# -- issue 27: a failed cell's text is printed as text, the report survives, the next step is said
BRACKETS = (
    "executor failed running [/bin/bash -o pipefail -c tb-pip-install /tmp/locks/nccl.txt && "
    "ldconfig -p | grep -q 'libnccl.so.2 ']: exit code: 141 [bold red]x[/] :smile: [link=http://a]b"
)


def test_summary_prints_engine_errors_with_brackets_as_text_and_names_the_skipped(m, monkeypatch):
    from trainbase.run import report

    b, _ = make(m, LOCAL, fail={"pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12"}, monkeypatch=monkeypatch)
    b.run()
    bad = b.jobs["pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12"]
    bad.reason, bad.failure_kind, bad.log = BRACKETS, "transient", "logs/run/x [1].log"
    out = io.StringIO()
    report.summary(b, out=out)
    text = out.getvalue()
    flat = re.sub(r"\s+", "", text)
    assert re.sub(r"\s+", "", BRACKETS) in flat  # verbatim: no markup parsed, no emoji replaced
    assert "pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12: failed:" in text
    assert "run the same command again" in text and "reused from cache" in text
    said = next(ln for ln in text.splitlines() if "skipped because of it" in ln)
    assert "(2)" in said and all(c in said for c in LOCAL[:2])
    assert "logs/run/x [1].log" in text
    rep = build_report(b)
    by = {c["name"]: c for c in rep["cells"]}
    assert by[bad.name]["failure_kind"] == "transient"
    assert sorted(by[bad.name]["skipped_because_of_this"]) == sorted(LOCAL[:2])


@pytest.mark.parametrize(
    "reason,tail,kind",
    [
        (
            "docker build exited 1: executor failed running [/bin/bash -o pipefail -c x | grep -q y]: exit code: 141",
            [],
            "transient",
        ),
        ("E: Failed to fetch http://deb.debian.org/debian/pool/x.deb  Connection reset by peer", [], "transient"),
        ("tb-fetch: sha256 mismatch for http://x: expected 0, got 1", [], "recipe"),
        ("E: Unable to locate package libfoo", [], "recipe"),
        ("no space left on device (free disk space or prune the build cache)", [], "environment"),
        ("docker build exited 1", ["#12 ERROR: process did not complete successfully: exit code: 137"], "transient"),
        ("make: *** [Makefile:1] Error 2", [], "unknown"),
    ],
)
def test_failure_kind_says_transient_environment_or_recipe(reason, tail, kind):
    from trainbase.run.failures import failure_kind

    assert failure_kind(reason, tail) == kind


def test_cli_writes_the_report_before_the_summary_and_keeps_the_exit_code(m, monkeypatch, tmp_path, capsys):
    """Even when printing the summary raises, the report is on disk and the exit code is the
    documented 1 for a failed cell."""
    from trainbase.cli import main as cli
    from trainbase.run import report

    def run_failing(self):
        for j in self.jobs.values():
            j.status, j.reason = JobState.FAILED, BRACKETS
        return 1

    def broken_summary(b, out=None):
        raise RuntimeError("terminal went away")

    monkeypatch.setattr(executor.Executor, "run", run_failing)
    monkeypatch.setattr(report, "summary", broken_summary)
    path = tmp_path / "r" / "build.json"
    code = cli.main(
        ["--matrix", "--select", "name=intelmpi2021.18-cuda12.8-cudnn9-debian12", "--no-supply", "--report", str(path)]
    )
    assert code == 1
    import json

    assert json.loads(path.read_text())["cells"][0]["reason"] == BRACKETS
    out = capsys.readouterr()
    assert "summary table failed" in out.err and "intelmpi2021.18-cuda12.8-cudnn9-debian12" in out.out
    # its last line: the one command that records this run in the catalogue (README's main command)
    last = out.out.strip().splitlines()[-1]
    assert last.startswith("record this run in the catalogue (docs/images.md): "), last
    assert f"build.py catalogue --report {path} --where " in last, last


def test_failure_reason_ignores_an_earlier_steps_tool_output():
    """A tb-* tool's informational line in the step before the failed one is not the reason
    (seen: "tb-entrypoints: ... wrappers in /usr/local/bin" named as why an echo step failed)."""
    tail = [
        "#20 0.067 tb-entrypoints: /opt/trainbase/env.sh (3 settings), wrappers in /usr/local/bin: mpirun",
        "#20 DONE 0.1s",
        "",
        "#21 [image 13/13] RUN echo boom && exit 3",
        "#21 0.043 boom",
        "#21 ERROR: executor failed running [/bin/bash -o pipefail -c echo boom && exit 3]: exit code: 3",
        "------",
        " > [image 13/13] RUN echo boom && exit 3:",
        "------",
        "executor failed running [/bin/bash -o pipefail -c echo boom && exit 3]: exit code: 3",
    ]
    reason = docker_build.failure_reason(tail, 1)
    assert "tb-entrypoints" not in reason and "exit code: 3" in reason, reason


# -- issue 37: a host that cannot run arm64 builds every amd64 cell and says the profile is incomplete
def test_a_platform_the_host_cannot_run_is_skipped_with_its_fix_and_the_run_is_incomplete(m, monkeypatch, tmp_path):
    from trainbase.run import report
    from trainbase_common import emulation

    monkeypatch.setattr(emulation, "host_arch", lambda: "amd64")

    def cannot(arches, log):
        if "arm64" in arches:
            raise emulation.EmulationError(
                "arm64",
                "registering a binfmt handler needs root",
                "run this build as root once; or leave the arm64 cells out: --select platform=linux/amd64",
            )
        return {"amd64": "native"}

    monkeypatch.setattr(emulation, "ensure", cannot)
    names = [
        "openmpi4.1.4-cuda12.8-cudnn9-debian12",
        "openmpi5.0.11-cuda13.0-cudnn9-debian12-arm64",
        "pytorch2.15.0-openmpi5.0.11-cuda13.2-cudnn9-debian12-arm64",
    ]
    b, log = make(m, names, monkeypatch=monkeypatch)
    assert b.run() == executor.INCOMPLETE == 3
    st = {n: j.status for n, j in b.jobs.items()}
    assert st["openmpi4.1.4-cuda12.8-cudnn9-debian12"] == "built"
    arm = [n for n in st if n.endswith("-arm64")]
    assert len(arm) >= 2 and all(st[n] == "skipped" for n in arm)
    assert all(
        "this host cannot run linux/arm64: registering a binfmt handler needs root. Fix: run this build as root"
        in b.jobs[n].reason
        for n in names[1:]
    )
    assert not any(n.endswith("-arm64") for ev, n, _ in log)  # nothing was started under a missing emulator
    out = io.StringIO()
    report.summary(b, out=out)
    text = out.getvalue()
    assert (
        f"INCOMPLETE (exit 3): {len(arm)} of {len(b.jobs)} cells left out (not built), because this host cannot run "
        "linux/arm64" in text
    )
    assert "--select platform=linux/amd64" in text
    assert sorted(build_report(b)["incomplete"]) == sorted(arm)
    # a real failure besides it is a failure (1), not an incomplete run
    b, _ = make(m, names, fail={"openmpi4.1.4-cuda12.8-cudnn9-debian12"}, monkeypatch=monkeypatch)
    assert b.run() == 1


@pytest.mark.parametrize(
    "message, status",
    [
        ("unexpected status from PUT request to https://r/v2/a/manifests/t: 403 Forbidden", 403),
        ("received unexpected HTTP status: 502 Bad Gateway", 502),
        ("unexpected status code 401 Unauthorized", 401),
        ("blob upload unknown: sha256:403a...", None),
        ("denied: requested access to the resource is denied", None),
    ],
)
def test_the_status_a_push_stream_quotes_is_read_from_its_words_not_its_digits(message, status):
    assert engine.registry_status(message) == status


def test_a_push_stream_error_is_auth_by_its_status_or_distributions_words(monkeypatch):
    class Api:
        def __init__(self, lines):
            self.lines = lines

        def push(self, repo, tag, stream, decode):
            return iter(self.lines)

    for line, auth in [
        (
            {"error": "unexpected status from PUT request to https://r/v2/x/blobs: 500 Internal Server Error, id 403"},
            False,
        ),
        ({"errorDetail": {"message": "denied: requested access to the resource is denied"}}, True),
        ({"error": "unexpected status from PUT request to https://r/v2/x/manifests/t: 403 Forbidden"}, True),
    ]:
        monkeypatch.setattr(engine.registry, "client", lambda line=line: type("C", (), {"images": Api([line])})())
        with pytest.raises(registry.RegistryError) as e:
            registry.push("r", "r/x:t")
        assert isinstance(e.value, registry.RegistryAuthError) is auth, (line, e.value)


def test_a_push_stream_that_dies_is_a_registry_error_naming_it(monkeypatch):
    """Issue 64: the engine restarted (or the read timed out) in the middle of a push: the
    urllib3 exception came from inside the stream's iteration, past the adapter, as a traceback."""
    import urllib3

    def dying(repo, tag, stream, decode):
        yield {"status": "Pushing"}
        raise urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(104, "reset by peer"))

    monkeypatch.setattr(
        engine.registry, "client", lambda: type("C", (), {"images": type("I", (), {"push": staticmethod(dying)})()})()
    )
    with pytest.raises(registry.RegistryError) as e:
        registry.push("r", "r/x:t")
    assert not isinstance(e.value, registry.RegistryAuthError)
    assert "the push stream of r/x:t stopped: ProtocolError" in str(e.value) and "reset by peer" in str(e.value)
