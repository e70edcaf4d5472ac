"""trainbase_conformance/speed.py: the probe's line, best-of, ratios and the loopback counter."""

import pytest

from trainbase_conformance import speed

PROC_NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 193011234  4711    0    0    0     0          0         0 193011234  4711    0    0    0     0       0          0
  eth0:     5290      43    0    0    0     0          0         0      796       8    0    0    0     0       0          0
"""


def test_loopback_bytes_reads_the_lo_row_not_eth0():
    assert speed.loopback_bytes(PROC_NET_DEV) == 193011234


def test_loopback_bytes_without_lo_is_an_error():
    with pytest.raises(ValueError, match="no loopback"):
        speed.loopback_bytes(PROC_NET_DEV.replace("    lo:", "   lo0x"))


def test_best_keeps_each_figures_best_and_ratios_compare_like_with_like():
    a = {"library": "x", "lat_8B_us": 1.0, "bw_64KiB_GBs": 5.0, "bw_4MiB_GBs": 4.0, "allreduce_4MiB_ms": 2.0}
    b = {"library": "x", "lat_8B_us": 0.5, "bw_64KiB_GBs": 4.0, "bw_4MiB_GBs": 9.0, "allreduce_4MiB_ms": 3.0}
    best = speed.best([a, b])
    assert (best["lat_8B_us"], best["bw_64KiB_GBs"], best["bw_4MiB_GBs"], best["allreduce_4MiB_ms"]) == (
        0.5,
        5.0,
        9.0,
        2.0,
    )
    r = speed.Ratios.of({**best, "bw_4MiB_GBs": 4.5}, best)
    assert r.bw_4MiB == 0.5 and r.lat_8B == 1.0


def test_parse_reads_the_probe_line_and_names_a_missing_one():
    assert speed.parse('noise\nTBSPEED {"bw_4MiB_GBs": 1.5, "pingpong_bytes": 7}\n')["pingpong_bytes"] == 7
    with pytest.raises(ValueError, match="no TBSPEED"):
        speed.parse("mpirun: command not found")
