"""The linkage check's judgement (trainbase_conformance/linkage.py): which missing libraries an image may
have, and that everything else is reported."""

from trainbase_conformance.linkage import loaded_first_by_its_package, unexplained_gaps

SP = "/opt/trainbase/venv/lib/python3.11/site-packages"


def test_a_tool_missing_a_library_is_reported():
    gaps = unexplained_gaps({"/usr/bin/ucx_perftest": ["libgomp.so.1"]}, {})
    assert gaps == {"/usr/bin/ucx_perftest": ["libgomp.so.1"]}


def test_driver_libraries_are_mounted_at_run_time_not_shipped():
    assert (
        unexplained_gaps(
            {
                f"{SP}/torch/lib/libcaffe2_nvrtc.so": ["libcuda.so.1"],
                "/usr/local/cuda/lib64/libnvidia-ml-user.so": ["libnvidia-ml.so.1"],
            },
            {},
        )
        == {}
    )


def test_an_expected_gap_covers_only_its_file_and_its_library():
    assert unexplained_gaps({"/opt/trainbase/venv/lib/libpsmx2-fi.so": ["libpsm2.so.2"]}, {}) == {}
    # the same file missing something else, and another file missing libpsm2, are defects
    assert unexplained_gaps({"/opt/trainbase/venv/lib/libpsmx2-fi.so": ["libpsm2.so.2", "libnuma.so.1"]}, {}) == {
        "/opt/trainbase/venv/lib/libpsmx2-fi.so": ["libnuma.so.1"]
    }
    assert unexplained_gaps({"/opt/openmpi/lib/libmpi.so.40": ["libpsm2.so.2"]}, {}) == {
        "/opt/openmpi/lib/libmpi.so.40": ["libpsm2.so.2"]
    }


def test_mpi4py_abi_variants_may_miss_their_libmpi():
    for abi, lib in (("mpich", "libmpi.so.12"), ("openmpi", "libmpi.so.40")):
        assert unexplained_gaps({f"{SP}/mpi4py/MPI.{abi}.cpython-311-x86_64-linux-gnu.so": [lib]}, {}) == {}


def test_a_plugin_linking_its_packages_own_library_is_whole_only_if_the_package_ships_it():
    plugin = f"{SP}/triton/plugins/libMLIRDialectPlugin.so"
    shipped = {"libtriton.so": [f"{SP}/triton/_C/libtriton.so"]}
    assert loaded_first_by_its_package(plugin, "libtriton.so", shipped)
    assert unexplained_gaps({plugin: ["libtriton.so"]}, shipped) == {}
    # the package's library deleted from the image: reported
    assert unexplained_gaps({plugin: ["libtriton.so"]}, {}) == {plugin: ["libtriton.so"]}
    # a library of that name elsewhere (another package) does not count
    elsewhere = {"libtriton.so": [f"{SP}/other/libtriton.so"]}
    assert unexplained_gaps({plugin: ["libtriton.so"]}, elsewhere) == {plugin: ["libtriton.so"]}


def test_a_pytorch_extension_may_link_torchs_libraries_that_import_torch_loads():
    ext = f"{SP}/deepspeed/ops/comm/deepspeed_shm_comm_op.cpython-311-x86_64-linux-gnu.so"
    shipped = {"libc10.so": [f"{SP}/torch/lib/libc10.so"], "libtorch_cpu.so": [f"{SP}/torch/lib/libtorch_cpu.so"]}
    assert unexplained_gaps({ext: ["libc10.so", "libtorch_cpu.so"]}, shipped) == {}
    assert unexplained_gaps({ext: ["libc10.so", "libtorch_cpu.so"]}, {"libc10.so": shipped["libc10.so"]}) == {
        ext: ["libtorch_cpu.so"]
    }
    # outside site-packages the rule does not apply: a program must find its libraries itself
    assert unexplained_gaps({"/usr/local/bin/tool": ["libc10.so"]}, shipped) == {"/usr/local/bin/tool": ["libc10.so"]}
