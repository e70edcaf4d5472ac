"""Where a cell's build time went (trainbase/build/step_times.py), read from a log in the form
`docker build --progress=plain` writes it: lines of the openmpi4.1.4 cell's log of a `.ci/run`
from an empty engine (2026-12-03), its long RUN lines cut."""

from __future__ import annotations

import io
import json

from trainbase.build import step_times

LOG = """\
$ /usr/bin/docker build --progress=plain -f images/openmpi4.1.4-cuda12.8-cudnn9-debian12/Dockerfile .

#1 [internal] load build definition from Dockerfile
#1 DONE 0.0s
#4 [os 1/4] FROM docker.io/trainbase-bootstrap/debian:12.15-slim
#4 DONE 0.0s
#6 [os 2/4] COPY imagefs/usr/local/bin/ /usr/local/bin/
#6 CACHED
#24 [openmpi-build 2/4] RUN --mount=type=cache,target=/var/cache/apt,sharing=locked     apt-get update  && apt-get install -y --no-install-recommends libucx-dev
#15 [libfabric-build 3/5] RUN --mount=type=cache,target=/root/.cache/pip     python3 -m venv /tmp/wheel-venv  && tb-pip-install --target /opt/x /tmp/locks/cuda12.8-headers-py3.11.txt
#24 [openmpi-build 2/4] RUN --mount=type=cache,target=/var/cache/apt,sharing=locked     apt-get update  && apt-get install -y --no-install-recommends libucx-dev
#24 41.02 Get:32 http://deb.debian.org/debian bookworm/main amd64 libucx-dev amd64 1.13.1-1 [1064 kB]
#24 DONE 54.4s
#15 DONE 33.8s
#26 [openmpi-build 4/4] RUN --mount=type=secret,id=ca_bundle     tb-fetch http://x/openmpi_4.1.4.orig.tar.xz 0 /tmp/o.tar.xz  && ./configure --prefix=/opt/openmpi  && make -j"$(nproc)" install
#26 448.8   CC       opal_datatype_copy.lo
#26 DONE 1406.2s
#30 [image 16/20] RUN ln -sf /opt/trainbase/lib/trainbase_launch.py /usr/local/bin/tb-launch
#30 DONE 0.8s
#31 [image 17/20] COPY images/openmpi4.1.4-cuda12.8-cudnn9-debian12/manifest.json /etc/trainbase/manifest.json
#31 DONE 0.1s
#36 exporting to image
#36 exporting layers 34.5s done
#36 DONE 34.5s
"""


def _steps(text: str = LOG) -> list[step_times.Step]:
    return step_times.parse(io.StringIO(text))


def test_each_step_is_named_by_its_stage_once_and_classified():
    got = {s.stage: (s.kind, s.seconds, s.cached) for s in _steps()}
    assert got == {
        "os 2/4": ("copy", 0.0, True),
        "openmpi-build 2/4": ("apt", 54.4, False),  # its header printed twice: one step
        "libfabric-build 3/5": ("pip", 33.8, False),
        "openmpi-build 4/4": ("compile", 1406.2, False),
        "image 16/20": ("other", 0.8, False),
        "image 17/20": ("copy", 0.1, False),
        "export": ("export", 34.5, False),
    }, "the [internal] steps and FROM are the engine's bookkeeping, left out"


def test_seconds_by_kind_and_the_summary_line_name_the_longest_step():
    steps = _steps()
    assert step_times.seconds_by_kind(steps) == {
        "compile": 1406.2,
        "pip": 33.8,
        "apt": 54.4,
        "copy": 0.1,
        "export": 34.5,
        "other": 0.8,
    }
    line = step_times.where_the_time_went("openmpi4.1.4-cuda12.8-cudnn9-debian12", steps)
    assert line == (
        "  openmpi4.1.4-cuda12.8-cudnn9-debian12: compile 23m26s (longest: openmpi-build 4/4, 23m26s), "
        "apt 54s, export 34s, pip 34s"
    )


def test_a_cell_served_from_cache_says_nothing_and_the_run_line_adds_the_cells():
    cached = _steps("#6 [os 2/4] COPY a /a\n#6 CACHED\n#7 [os 3/4] RUN make -j2\n#7 CACHED\n")
    assert step_times.where_the_time_went("c", cached) is None
    lines = step_times.summary_lines([("a", _steps()), ("b", cached), ("c", _steps())])
    assert lines[0].startswith("where the time went")
    assert [line.split(":")[0].strip() for line in lines[1:-1]] == ["a", "c"]
    assert lines[-1] == "  this run: compile 46m52s, pip 1m08s, apt 1m49s, export 1m09s, other 2s"


def test_the_extension_builds_of_the_framework_blocks_count_as_compiles():
    for run in (
        "RUN MAX_JOBS=2 tb-pip-install /tmp/locks/te.txt",
        "RUN DS_BUILD_OPS=1 pip install deepspeed==0.19.8",
        "RUN HOROVOD_WITH_PYTORCH=1 pip install horovod",
        "RUN cd /src && cmake -S . -B build && ninja -C build",
        "RUN make MPI=1 DSO=1 BIN_FILES_LIST=x",
    ):
        assert step_times.kind_of(run) == "compile", run
    assert step_times.kind_of("RUN tb-pip-install --target /x /tmp/locks/cuda.txt") == "pip"
    assert step_times.kind_of("RUN mkdir -p /x && makedepend") == "other"


def test_a_failed_step_is_marked_and_a_missing_log_gives_no_steps(tmp_path):
    steps = _steps("#9 [image 3/9] RUN make install\n#9 ERROR: process did not complete successfully\n")
    assert [(s.stage, s.failed, s.seconds) for s in steps] == [("image 3/9", True, None)]
    assert step_times.report_fields(None) == {"steps": [], "seconds_by_kind": dict.fromkeys(step_times.KINDS, 0.0)}
    assert step_times.report_fields(str(tmp_path / "gone.log"))["steps"] == []
    log = tmp_path / "c.log"
    log.write_text(LOG)
    fields = step_times.report_fields(str(log))
    json.dumps(fields)  # the report is JSON
    assert fields["seconds_by_kind"]["compile"] == 1406.2
    assert fields["steps"][3] == {
        "step": "openmpi-build 4/4",
        "kind": "compile",
        "seconds": 1406.2,
        "cached": False,
        "failed": False,
        "instruction": fields["steps"][3]["instruction"],
    }
