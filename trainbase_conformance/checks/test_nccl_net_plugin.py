"""The NCCL network plugin: every file the manifest declares is there, loads with every
dependency resolved inside the image, exports the plugin interface the image's NCCL asks for
first, and declines on a node without its fabric (issue 70).

NCCL dlopens libnccl-net.so by itself (NCCL_NET_PLUGIN unset) and keeps the first network whose
init succeeds with a device: the plugin, its own IB, then sockets (NCCL's src/plugin/net.cc, 2.27
and 2.30). So a plugin that does not load, or exports only older interfaces than NCCL's newest,
or takes a node it does not serve, changes every job's transport. NCCL looks its symbols up by
name, newest first, and the names are string literals in libnccl.so.2: what it asks for is read
from the library, not from a table here. Expectations come from the manifest's
components.nccl_net_plugin."""

import shlex

import pytest

from trainbase_conformance.checks.test_libfabric import declared
from trainbase_conformance.fixtures import PROBE_DIR

LABEL = "io.trainbase.nccl-net-plugin"


def _probe(target, files, init=False):
    flag = "--init " if init else ""
    return target.json_probe(
        f"{target.python} {PROBE_DIR}/nccl_net_plugin.py {flag}" + " ".join(shlex.quote(f) for f in files)
    )


@pytest.mark.static
@pytest.mark.evidence("load")
def test_plugin_loads_with_every_dependency_in_the_image(target):
    """Each declared plugin file is there, `ldd` resolves every library it needs inside the image
    (libfabric, hwloc, the image's one cudart: never a driver library), and it dlopens as NCCL
    opens it (RTLD_NOW | RTLD_LOCAL); the label names the plugin."""
    plugin = declared(target, "nccl_net_plugin")
    for f in plugin["files"]:
        r = target.sh(f"ldd {shlex.quote(f)}")
        assert r.rc == 0, f"{f}: ldd exited {r.rc}: {(r.stderr or r.stdout).strip()[-300:]}"
        missing = [ln.split()[0] for ln in r.stdout.splitlines() if "not found" in ln]
        assert not missing, f"{f} needs {missing}, which resolve to nothing in the image"
    info = _probe(target, plugin["files"])
    bad = {f: v["load"] for f, v in info["plugins"].items() if v["load"] != "loaded"}
    assert not bad, f"plugin files that do not dlopen: {bad}"
    # the release the plugin announces at init ("NET/OFI Initializing aws-ofi-nccl 1.21.1")
    banner = f"{plugin['name']} {plugin['version']}"
    net = next((f for f in plugin["files"] if f.endswith("/libnccl-net.so")), plugin["files"][0])
    r = target.sh(f"grep -a -c -F {shlex.quote(banner)} {shlex.quote(net)}")
    assert r.stdout.strip() not in ("", "0"), (
        f"{net} does not announce {banner!r}: another release than the manifest says"
    )
    if not target.foreign:
        want = f"{plugin['name']}-{plugin['version']}"
        assert target.labels.get(LABEL) == want, f"{LABEL} is {target.labels.get(LABEL)}, the manifest says {want}"


@pytest.mark.static
@pytest.mark.evidence("load")
def test_plugin_exports_the_interface_the_images_nccl_asks_for_first(target):
    """The net plugin (the file NCCL opens by default) exports NCCL's newest network interface
    (ncclNetPlugin_vN, the first NCCL looks up), and every tuner file exports a tuner interface
    NCCL looks up (it takes the newest both have)."""
    plugin = declared(target, "nccl_net_plugin")
    info = _probe(target, plugin["files"])
    nccl = info["nccl"]
    assert "error" not in nccl, f"libnccl.so.2 does not load: {nccl['error']}"
    assert nccl["net"], f"{nccl['path']} names no ncclNetPlugin_vN symbol: cannot tell what it asks for"
    newest = nccl["net"][0]
    for f, v in info["plugins"].items():
        if "/libnccl-net" in f:
            assert newest in v["net"], (
                f"{f} exports ncclNetPlugin_v{v['net']}, the image's NCCL ({nccl['path']}) asks for "
                f"v{newest} first: the plugin is older than the NCCL it serves"
            )
        elif "tuner" in f:
            common = sorted(set(v["tuner"]) & set(nccl["tuner"]), reverse=True)
            assert common, f"{f} exports ncclTunerPlugin_v{v['tuner']}, NCCL looks up v{nccl['tuner']}: none in common"


@pytest.mark.cpu
@pytest.mark.evidence("run")
def test_plugin_declines_on_a_node_without_its_fabric(target):
    """On a node without its fabric (no EFA device here, and no GPU on a CPU runner) the plugin's
    init returns an error and the process goes on, so NCCL moves to its own IB or socket
    transport; a plugin that took such a node, or aborted the process, would change or end every
    job there. The GPU tier shows the same from NCCL's own log on a GPU node."""
    plugin = declared(target, "nccl_net_plugin")
    net = next(f for f in plugin["files"] if f.endswith("/libnccl-net.so"))
    r = target.sh("ls /sys/class/infiniband 2>/dev/null; ls /dev/infiniband 2>/dev/null")
    if "efa" in r.stdout or "rdmap" in r.stdout:
        pytest.skip("n/a: this node has EFA devices (the GPU tier shows the plugin taking them)")
    info = _probe(target, [net], init=True)
    assert "init" in info, f"{net} exports no ncclNetPlugin_v8 to call init on"
    got = info["init"]
    assert got["rc"] != 0, (
        f"{got['name']}'s init succeeded on a node without EFA: NCCL would run its collectives over "
        f"the plugin instead of its own transport ({got['log'][-5:]})"
    )
