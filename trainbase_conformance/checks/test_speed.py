"""Speed: the image moves intra-node MPI messages about as fast as the host does.

Issue 28: the Open MPI 4 image, run as users run it (Docker's default profile, no extra
capability), moved 4 MiB messages at 0.43x the host's speed, and every functional check
passed. This check runs the same mpi4py ping-pong on the host's own MPI and in the image, in
the same run, and fails an image below FLOOR_4MIB of the host, naming the transport it used.
Ratios only, never an absolute time (trainbase_conformance/speed.py)."""

import os
import re
import subprocess

import pytest

from trainbase_conformance import speed
from trainbase_conformance.fixtures import PROBE_DIR
from trainbase_conformance.resources import PROBES

ROUNDS = 2  # host and image alternate at least this many times; each keeps its best figures
# ... and up to this many while the image is below the floor: a loaded machine (a CI runner
# building next door) slowed one side by 3x in a round here and failed two good images; a
# transport that really falls back stays below in every round (0.43x), so it still fails.
MAX_ROUNDS = 6
# the most of a ping-pong's payload that may cross the container's loopback device: PMIx, UCX
# wire-up and Open MPI's out-of-band channel send a few KiB over TCP; a transport that moves
# messages themselves over TCP sends all of them (100 % and more, with headers)
MAX_SHARE_ON_LOOPBACK = 0.05


def _transport(target) -> str:
    """What the image's MPI chose for two ranks in this container, in its own words."""
    mpi = target.need_mpi()
    barrier = f"{target.python} -c 'from mpi4py import MPI; MPI.COMM_WORLD.Barrier()'"
    if mpi.kind == "openmpi":
        r = target.sh(f"{mpi.local(2)} --mca pml_base_verbose 10 {barrier} 2>&1", timeout=120)
        pml = sorted(set(re.findall(r"select: component (\w+) selected", r.stdout)))
        env = target.sh("env | grep -E '^(OMPI_MCA_(pml|btl)|UCX_TLS)' | sort").stdout.split()
        return f"pml {','.join(pml) or '?'}" + (f" ({' '.join(env)})" if env else "")
    r = target.sh(f"I_MPI_DEBUG=5 {mpi.local(2)} {barrier} 2>&1", timeout=120)
    said = [ln.split("):", 1)[-1].strip() for ln in r.stdout.splitlines() if re.search(r"provider|shm|fabric", ln)]
    return "; ".join(dict.fromkeys(said))[:300] or "?"


def _contention(target) -> str:
    """What else held the cores and the shared memory when the image was slow: the host's load,
    the container's busiest processes (a rank left spinning by an earlier check takes a core
    from the ping-pong's two) and its /dev/shm (Open MPI's backing files live there)."""

    def busiest(text: str) -> str:
        return "; ".join(" ".join(ln.split())[:120] for ln in text.splitlines() if ln.strip())

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    ps = ["ps", "-eo", "pcpu=,etimes=,args=", "--sort=-pcpu"]
    host = subprocess.run(ps, capture_output=True, text=True, timeout=30, check=False).stdout.splitlines()[:4]
    r = target.sh("ps -eo pcpu=,etimes=,args= --sort=-pcpu | head -n 4; df -k /dev/shm | tail -n 1", timeout=30)
    return (
        f"host load {load}, its busiest: {busiest(chr(10).join(host))}; "
        f"in the container: {busiest(r.stdout or '') or '(ps printed nothing)'}"
    )


@pytest.mark.cpu
@pytest.mark.evidence("run")
@pytest.mark.native_only(
    "a ratio to the host's MPI speed: under emulation every instruction of the image's "
    "MPI is translated and the host's is not (measured: 0.64x for an arm64 image whose "
    "transport settings pass natively)"
)
def test_intra_node_bandwidth_is_near_the_hosts(target):
    mpi = target.need_mpi()
    try:
        speed.host_reference(str(PROBES / "pingpong_mpi4py.py"), reps=1, timeout=120)
    except FileNotFoundError as e:
        pytest.skip(f"no host reference: {e}")
    speed.settle()
    hosts, images = [], []
    for n in range(1, MAX_ROUNDS + 1):
        hosts.append(speed.host_reference(str(PROBES / "pingpong_mpi4py.py")))
        r = target.sh(f"{mpi.local(2)} {target.python} {PROBE_DIR}/pingpong_mpi4py.py 5", timeout=300)
        assert r.rc == 0, f"the ping-pong probe exited {r.rc}: {(r.stderr or r.stdout).strip()[-1500:]}"
        images.append(speed.parse(r.stdout))
        host, image = speed.best(hosts), speed.best(images)
        ratios = speed.Ratios.of(image, host)
        if n >= ROUNDS and ratios.bw_4MiB >= speed.FLOOR_4MIB:
            break
    print(f"host {host}\nimage {image}\nratios {ratios.as_dict()} after {n} rounds")
    if ratios.bw_4MiB < speed.FLOOR_4MIB:
        pytest.fail(
            f"4 MiB ping-pong at {image['bw_4MiB_GBs']} GB/s is {ratios.bw_4MiB}x the host's "
            f"{host['bw_4MiB_GBs']} GB/s ({host['library']}; best of {n} alternating rounds each: image "
            f"{[x['bw_4MiB_GBs'] for x in images]}, host {[x['bw_4MiB_GBs'] for x in hosts]}), "
            f"below {speed.FLOOR_4MIB}x; the image's MPI "
            f"used: {_transport(target)}. Cross-memory attach is refused in this container (Docker's "
            f"default seccomp profile without SYS_PTRACE): a transport that falls back to TCP "
            f"for large intra-node messages is the usual cause (docs/performance.md). While it ran: "
            f"{_contention(target)}"
        )


@pytest.mark.cpu
@pytest.mark.evidence("run")
def test_intra_node_messages_stay_off_the_network_stack(target):
    """Two ranks in one container must not send their messages through TCP. The bandwidth ratio
    above catches it only when TCP is much slower than shared memory; on a faster kernel UCX's
    TCP loopback reached 0.57x (the floor is 0.7x) and a noisy round can lift it further, so this
    check counts the bytes the run sent through the container's loopback device instead."""
    mpi = target.need_mpi()
    r = target.sh(
        f"cat /proc/net/dev; echo TBMARK; {mpi.local(2)} {target.python} {PROBE_DIR}/pingpong_mpi4py.py 1 0.25;"
        " rc=$?; echo TBMARK; cat /proc/net/dev; exit $rc",
        timeout=300,
    )
    assert r.rc == 0, f"the ping-pong probe exited {r.rc}: {(r.stderr or r.stdout).strip()[-1500:]}"
    before, run, after = r.stdout.split("TBMARK\n")
    payload = speed.parse(run)["pingpong_bytes"]
    on_lo = speed.loopback_bytes(after) - speed.loopback_bytes(before)
    print(f"ping-pong payload {payload} B, loopback device {on_lo} B ({on_lo / payload:.3f})")
    if on_lo > MAX_SHARE_ON_LOOPBACK * payload:
        pytest.fail(
            f"{on_lo / 2**20:.0f} MiB crossed the container's loopback device while two ranks exchanged "
            f"{payload / 2**20:.0f} MiB of ping-pong messages ({on_lo / payload:.0%}; at most "
            f"{MAX_SHARE_ON_LOOPBACK:.0%} may): ranks on one node talk over TCP instead of shared memory. "
            f"The image's MPI used: {_transport(target)}. Where cross-memory attach is refused (Docker's "
            f"default seccomp profile without SYS_PTRACE, per-rank user namespaces) a transport forced onto "
            f"UCX falls back to TCP for large messages (docs/performance.md)"
        )
