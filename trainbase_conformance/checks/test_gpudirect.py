"""GPUDirect RDMA on a runner with HCAs and GPUs: NCCL must move data between nodes straight
between GPU memory and the HCA, not through host memory. The verdict is the image's own doctor's
(`tb-doctor --only gpudirect`: the kernel side, and NCCL's INFO log of a communicator whose ranks
connect through the HCA), so the same words reach an operator who runs the doctor on a node."""

import pytest


@pytest.mark.fabric
@pytest.mark.evidence("run")
def test_gpudirect_rdma_on_an_rdma_runner(target):
    """The doctor's gpudirect.kernel (nvidia_peermem or DMA-BUF) and gpudirect.nccl (every NET
    channel GDRDMA) pass, or the check fails with their reasons (no peermem and no DMA-BUF, an
    NCCL_* setting, the GPU too far from the HCA). A fabric runner without GPUs skips, saying so."""
    rc, report = target.doctor("--expect ib --only gpudirect")
    checks = {c["id"]: c for c in report["checks"]}
    bad = [f"{cid}: {c['summary']}" for cid, c in checks.items() if c["status"] in ("fail", "warn")]
    assert not bad, bad
    skipped = [c["summary"] for c in checks.values() if c["status"] == "skip"]
    if skipped:
        pytest.skip(skipped[0])
    print(f"GPUDirect RDMA: {checks['gpudirect.kernel']['summary']}; {checks['gpudirect.nccl']['summary']}")
