"""The engine adapter's pure parts, without an engine."""

from trainbase_common import engine
from trainbase_common.engine import containers as engine_containers


def test_exec_stream_demux_splits_stdout_and_stderr():
    def frame(kind, data):
        return bytes([kind, 0, 0, 0]) + len(data).to_bytes(4, "big") + data

    class Sock:
        def __init__(self, data):
            self.data = data

        def recv(self, n):
            out, self.data = self.data[:n], self.data[n:]
            return out

    out, err = engine_containers.demux(Sock(frame(1, b"hello ") + frame(2, b"oops") + frame(1, b"world")))
    assert (out, err) == (b"hello world", b"oops")


# -- issue 38: the GPU tier's containers are asked for every GPU, the RDMA devices and IPC_LOCK
def _fake_host(monkeypatch, tmp_path, smi_lines, ib_nodes):
    import shutil
    import subprocess

    from trainbase_conformance import host

    ib = tmp_path / "infiniband"
    if ib_nodes:
        ib.mkdir()
        for n in ib_nodes:
            (ib / n).write_text("")
    real_path = host.Path
    monkeypatch.setattr(host, "Path", lambda p: ib if p == "/dev/infiniband" else real_path(p))
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(
        subprocess, "run", lambda *a, **kw: subprocess.CompletedProcess(a[0], 0, "\n".join(smi_lines), "")
    )
    monkeypatch.setattr(engine, "info", lambda: type("Info", (), {"runtimes": ["runc", "nvidia"]})())
    return host.probe_host()


def test_gpu_runner_containers_get_every_gpu_the_rdma_devices_and_ipc_lock(monkeypatch, tmp_path):
    import docker

    gpus = [f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})" for i in range(8)]
    caps = _fake_host(monkeypatch, tmp_path, gpus, ["uverbs0", "rdma_cm"])
    assert caps.gpu and caps.gpu_count == 8 and caps.ib
    seen = {}

    class Containers:
        def run(self, image, command, **kw):
            seen.update(kw)
            return type("C", (), {"id": "c0"})()

    # the client run_detached asks for, where it looks it up
    fake = type("Client", (), {"containers": Containers()})()
    monkeypatch.setattr(engine_containers, "client", lambda: fake)
    assert engine.run_detached("img", ["sleep", "1"], name="n", labels={}, opts=caps.run_options()) == "c0"
    (req,) = seen["device_requests"]
    assert isinstance(req, docker.types.DeviceRequest) and req["Count"] == -1 and req["Capabilities"] == [["gpu"]]
    ib = tmp_path / "infiniband"
    assert sorted(seen["devices"]) == sorted(f"{ib / n}:{ib / n}" for n in ("uverbs0", "rdma_cm"))
    assert seen["cap_add"] == ["IPC_LOCK"]
    flags = caps.run_options().describe()
    assert "--gpus all" in flags and f"--device {ib / 'uverbs0'}" in flags and "--cap-add IPC_LOCK" in flags


def test_a_host_without_gpus_or_rdma_asks_for_neither(monkeypatch, tmp_path):
    caps = _fake_host(monkeypatch, tmp_path, [], [])
    assert not caps.gpu and caps.gpu_count == 0 and not caps.ib
    opts = caps.run_options()
    assert not opts.gpus and opts.devices == () and opts.cap_add == ()
