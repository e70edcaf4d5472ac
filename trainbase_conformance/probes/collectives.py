#!/usr/bin/env python3
"""Every collective a training job runs, value-checked and timed like nccl-tests, one process per
rank: all-reduce, all-gather, reduce-scatter, all-to-all, broadcast (from every root) and
send/recv between every pair of ranks, over torch.distributed (NCCL on GPUs, one process per
GPU; gloo on CPUs, so the same probe runs where no GPU is).

Every element of every result is compared with what it must be: rank r fills element i with
``fill(r, i) = (i % 8191) * 1024 + r + 1`` (int32), so data from a wrong peer or a wrong offset
is a different number. Sizes double from --min-bytes to --max-bytes; per size the first call is
checked, then --iters calls are timed (the slowest rank's mean). algbw = bytes / time; busbw =
algbw x nccl-tests' factor for n ranks: all-reduce 2(n-1)/n; all-gather, reduce-scatter and
all-to-all (n-1)/n; broadcast and send/recv 1. ``bytes`` is nccl-tests' size: the all-reduce and
broadcast buffer, all-gather's output, reduce-scatter's input, all-to-all's send buffer, one
send/recv message. A collective the backend does not have is reported "unsupported by backend"
with the backend's own words, never emulated by another.

  python collectives.py [--backend auto|nccl|gloo] [--ranks N] [--max-bytes B]
        spawns N ranks here (default: every GPU with NCCL, 2 with gloo) and prints one JSON
        document (merge()); exit 1 when any value is wrong or any rank failed
  python collectives.py --nodes K --node-rank R --master HOST --port P --ranks N ...
        one node of a K-node job: spawns its N ranks (global ranks R*N..R*N+N-1) and prints each
        rank's ``TBCOLL {json}`` line; whoever started the nodes merges them (merge())
  --inject-wrong COLLECTIVE[,...]   (the unit tests' broken case) rank world-1 changes one
        element of each result of those collectives after the call: the check must catch it

Stdlib and torch only, Python 3.8+: it runs in any image with PyTorch.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "sendrecv")
ITEM_BYTES = 4  # int32: sums are exact, so a check is equality
WRAP, STRIDE = 8191, 1024  # fill's period and rank spacing: sums stay below 2**31 up to 255 ranks
MAX_RANKS = 255
LINE = "TBCOLL "


# --------------------------------------------------------------------------- pure: what must come out


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw for ``n`` ranks (doc/PERFORMANCE.md there)."""
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective in ("broadcast", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


def sizes(min_bytes: int, max_bytes: int) -> list:
    """Doubling from min_bytes up to and including max_bytes."""
    out, b = [], max(min_bytes, ITEM_BYTES)
    while b <= max_bytes:
        out.append(b)
        b *= 2
    return out


def plan(collective: str, min_bytes: int, max_bytes: int, n: int) -> list:
    """The sizes to measure: sizes(), less those that round to the same bytes moved as the one
    before (tiny sizes split over many ranks)."""
    out, moved = [], set()
    for b in sizes(min_bytes, max_bytes):
        m = moved_bytes(collective, b, n)
        if m not in moved:
            moved.add(m)
            out.append(b)
    return out


def counts(collective: str, nbytes: int, n: int) -> tuple:
    """(elements each rank sends, elements each rank receives) for nccl-tests' size ``nbytes``:
    per-rank chunks rounded down to whole elements, at least one."""
    total = max(nbytes // ITEM_BYTES, 1)
    chunk = max(total // n, 1)
    if collective == "all_gather":
        return chunk, chunk * n
    if collective == "reduce_scatter":
        return chunk * n, chunk
    if collective == "all_to_all":
        return chunk * n, chunk * n
    return total, total


def moved_bytes(collective: str, nbytes: int, n: int) -> int:
    """nccl-tests' size as really moved after rounding to whole chunks."""
    send, recv = counts(collective, nbytes, n)
    return ITEM_BYTES * (recv if collective == "all_gather" else send)


def fill(rank, index):
    """What rank ``rank`` puts at ``index`` (ints, or torch integer tensors alike)."""
    return index % WRAP * STRIDE + rank + 1


def expected(collective: str, rank: int, n: int, index, chunk: int = 1, peer: int = 0):
    """Element ``index`` of ``collective``'s result on ``rank`` of ``n``: ``chunk`` is the per-rank
    count (all-gather, reduce-scatter, all-to-all), ``peer`` the root (broadcast) or the sender
    (sendrecv). Works on ints and on torch integer tensors."""
    if collective == "all_reduce":
        return n * (index % WRAP * STRIDE) + n * (n + 1) // 2
    if collective == "all_gather":
        return fill(index // chunk, index % chunk)
    if collective == "reduce_scatter":
        j = rank * chunk + index
        return n * (j % WRAP * STRIDE) + n * (n + 1) // 2
    if collective == "all_to_all":
        return fill(index // chunk, rank * chunk + index % chunk)
    if collective in ("broadcast", "sendrecv"):
        return fill(peer, index)
    raise ValueError(f"unknown collective {collective!r}")


def first_mismatch(got, want):
    """None when equal element by element, else {"index", "got", "want", "wrong"} of the first
    wrong element and how many are wrong (lists, or torch tensors compared on their device)."""
    if hasattr(got, "ne"):
        bad = got.ne(want)
        wrong = int(bad.sum().item())
        if not wrong:
            return None
        i = int(bad.nonzero()[0][0].item())
        want_i = want[i] if hasattr(want, "ne") else want
        return {"index": i, "got": int(got[i].item()), "want": int(want_i), "wrong": wrong}
    if len(got) != len(want):
        return {"index": min(len(got), len(want)), "got": len(got), "want": len(want), "wrong": -1}
    wrong_at = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
    if not wrong_at:
        return None
    i = wrong_at[0]
    return {"index": i, "got": int(got[i]), "want": int(want[i]), "wrong": len(wrong_at)}


def merge(rank_docs: list) -> dict:
    """One document from every rank's own: per collective and size the slowest rank's time, algbw
    and busbw from it, ``ok`` only when every rank's check passed, the lowest failing rank's first
    mismatch (with its rank, and the pair for send/recv). A rank that failed or never reported
    makes the document not ok."""
    docs = sorted(rank_docs, key=lambda d: d.get("rank", -1))
    world = max([d.get("world", 0) for d in docs] + [0])
    errors = [f"rank {d.get('rank')}: {d['error']}" for d in docs if d.get("error")]
    seen = sorted(d["rank"] for d in docs if "rank" in d)
    if seen != list(range(world)):
        errors.append(f"ranks that reported: {seen}, want 0..{world - 1}")
    out = {
        "probe": "collectives",
        "backend": docs[0].get("backend", "?") if docs else "?",
        "world": world,
        "devices": [d.get("device", "?") for d in docs],
        "torch": docs[0].get("torch", "?") if docs else "?",
        "collectives": {},
        "errors": errors,
    }
    for coll in [c for c in COLLECTIVES if any(c in d.get("collectives", {}) for d in docs)]:
        measured = [
            (d.get("rank"), d["collectives"][coll])
            for d in docs
            if not d.get("error") and coll in d.get("collectives", {})
        ]
        entries = [e for _, e in measured]
        if not entries:
            out["collectives"][coll] = {"missing": "no rank measured it"}
            continue
        note = next((e[k] for e in entries for k in ("unsupported", "skipped") if k in e), None)
        if note is not None:
            key = "unsupported" if any("unsupported" in e for e in entries) else "skipped"
            out["collectives"][coll] = {key: note}
            continue
        rows = []
        for i, first in enumerate(entries[0]["rows"]):
            per_rank = [(rank, e["rows"][i]) for rank, e in measured if i < len(e["rows"])]
            t = max(r["time_s"] for _, r in per_rank)
            bad = [(rank, r["mismatch"]) for rank, r in per_rank if r["mismatch"]]
            algbw = first["bytes"] / t / 1e9 if t > 0 else 0.0
            row = {
                "bytes": first["bytes"],
                "time_us": round(t * 1e6, 2),
                "algbw_GBps": round(algbw, 3),
                "busbw_GBps": round(algbw * bus_factor(coll, world), 3),
                "ok": not bad,
                "first_mismatch": dict(bad[0][1], rank=bad[0][0]) if bad else None,
            }
            rows.append(row)
        out["collectives"][coll] = {"api": entries[0].get("api", coll), "rows": rows}
    out["ok"] = not errors and all(
        ("rows" in c and all(r["ok"] for r in c["rows"])) or "unsupported" in c or "skipped" in c
        for c in out["collectives"].values()
    )
    return out


def describe_mismatch(m: dict) -> str:
    where = "".join(f", {k} {m[k]}" for k in ("root", "pair") if k in m)
    return (
        f"WRONG: rank {m.get('rank')} element {m['index']} = {m['got']}, want {m['want']} ({m['wrong']} wrong{where})"
    )


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def table(doc: dict) -> str:
    """nccl-tests' columns, one line per collective and size (Markdown)."""
    lines = [
        "| collective | bytes | time (us) | algbw (GB/s) | busbw (GB/s) | values |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for coll, c in doc["collectives"].items():
        if "rows" not in c:
            why = next((f"{k}: {v}" for k, v in c.items()), "")
            lines.append(f"| {coll} | | | | | {why} |")
            continue
        for r in c["rows"]:
            m = r["first_mismatch"]
            verdict = "ok" if r["ok"] else describe_mismatch(m)
            lines.append(
                f"| {coll} | {human_bytes(r['bytes'])} | {r['time_us']:.1f} | {r['algbw_GBps']:.3f} | "
                f"{r['busbw_GBps']:.3f} | {verdict} |"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- one rank

UNSUPPORTED_WORDS = ("not supported", "does not support", "unsupported", "not implemented")


def unsupported(e: BaseException) -> bool:
    """The backend lacks the operation (said before any byte moved), as opposed to a failure."""
    return isinstance(e, NotImplementedError) or any(w in str(e).lower() for w in UNSUPPORTED_WORDS)


def run_rank(a: argparse.Namespace, rank: int, local_rank: int) -> dict:
    import datetime

    import torch
    import torch.distributed as dist

    n = a.world
    if a.backend == "nccl":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        device_name = f"cuda:{local_rank} {torch.cuda.get_device_name(dev)}"
    else:
        dev = torch.device("cpu")
        device_name = "cpu"
    dist.init_process_group(
        a.backend,
        init_method=f"tcp://{a.master}:{a.port}",
        rank=rank,
        world_size=n,
        timeout=datetime.timedelta(seconds=a.timeout),
    )

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def arange(count: int):
        return torch.arange(count, dtype=torch.int64, device=dev)

    def filled(who: int, count: int):
        return fill(who, arange(count)).to(torch.int32)

    def corrupt(coll: str, out) -> None:
        if coll in a.inject_wrong.split(",") and rank == n - 1:
            out.view(-1)[out.numel() // 2] += 1

    def slowest(dt: float) -> float:
        t = torch.tensor([dt], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def one_size(coll: str, nbytes: int, api: dict) -> dict:
        send_n, recv_n = counts(coll, nbytes, n)
        chunk = recv_n if coll == "reduce_scatter" else (send_n if coll == "all_gather" else send_n // n)
        mismatch = None
        inp = filled(rank, send_n)
        out = torch.empty(recv_n, dtype=torch.int32, device=dev)

        if coll == "all_reduce":

            def op() -> None:
                dist.all_reduce(out)

            out.copy_(inp)
        elif coll == "all_gather":
            if api.get(coll) == "all_gather (list)":

                def op() -> None:
                    dist.all_gather(list(out.chunk(n)), inp)
            else:

                def op() -> None:
                    dist.all_gather_into_tensor(out, inp)
        elif coll == "reduce_scatter":
            if api.get(coll) == "reduce_scatter (list)":

                def op() -> None:
                    dist.reduce_scatter(out, list(inp.chunk(n)))
            else:

                def op() -> None:
                    dist.reduce_scatter_tensor(out, inp)
        elif coll == "all_to_all":

            def op() -> None:
                dist.all_to_all_single(out, inp)
        elif coll == "broadcast":

            def op() -> None:
                dist.broadcast(out, src=0)
        else:

            def op() -> None:
                reqs = dist.batch_isend_irecv(
                    [dist.P2POp(dist.isend, inp, (rank + 1) % n), dist.P2POp(dist.irecv, out, (rank - 1) % n)]
                )
                for q in reqs:
                    q.wait()

        idx = arange(recv_n)
        if coll == "broadcast":  # the checked pass: every rank in turn the root
            for root in range(n):
                out.copy_(inp)
                dist.broadcast(out, src=root)
                sync()
                corrupt(coll, out)
                mismatch = mismatch or first_mismatch(out, expected(coll, rank, n, idx, peer=root))
                if mismatch:
                    mismatch.setdefault("root", root)
        elif coll == "sendrecv":  # every ordered pair: in round s, r sends to r+s
            for s in range(1, n):
                dst, src = (rank + s) % n, (rank - s) % n
                reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, inp, dst), dist.P2POp(dist.irecv, out, src)])
                for q in reqs:
                    q.wait()
                sync()
                corrupt(coll, out)
                mismatch = mismatch or first_mismatch(out, expected(coll, rank, n, idx, peer=src))
                if mismatch:
                    mismatch.setdefault("pair", f"{src}->{rank}")
        else:
            op()
            sync()
            corrupt(coll, out)
            mismatch = first_mismatch(out, expected(coll, rank, n, idx, chunk=chunk))
        del idx
        if coll == "all_reduce":
            out.copy_(inp)
        iters = a.iters if nbytes <= (1 << 20) else max(1, a.iters // 4)
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            op()
        sync()
        dt = slowest((time.perf_counter() - t0) / iters)
        return {"bytes": moved_bytes(coll, nbytes, n), "time_s": dt, "mismatch": mismatch}

    def probe_api(coll: str, api: dict) -> str | None:
        """The backend's own name for the collective, or why it has none (on a tiny call)."""
        tries = {
            "all_gather": ("all_gather_into_tensor", "all_gather (list)"),
            "reduce_scatter": ("reduce_scatter_tensor", "reduce_scatter (list)"),
        }.get(coll, (coll,))
        last = ""
        for name in tries:
            api[coll] = name
            try:
                one_size(coll, ITEM_BYTES * n, api)
                return None
            except (RuntimeError, NotImplementedError, ValueError) as e:
                if not unsupported(e):
                    raise
                last = f"unsupported by backend {a.backend} ({name}): {str(e).splitlines()[0][:200]}"
        return last

    doc = {
        "rank": rank,
        "world": n,
        "backend": a.backend,
        "device": device_name,
        "torch": torch.__version__,
        "collectives": {},
    }
    api: dict = {}
    for coll in a.collectives:
        if coll == "sendrecv" and n < 2:
            doc["collectives"][coll] = {"skipped": "one rank: no pair to send between"}
            continue
        why = probe_api(coll, api)
        if why:
            doc["collectives"][coll] = {"unsupported": why}
            continue
        doc["collectives"][coll] = {
            "api": api[coll],
            "rows": [one_size(coll, b, api) for b in plan(coll, a.min_bytes, a.max_bytes, n)],
        }
    dist.barrier()
    dist.destroy_process_group()
    return doc


# --------------------------------------------------------------------------- launch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    ap.add_argument("--ranks", type=int, default=0, help="ranks on this node (default: GPUs with NCCL, 2 with gloo)")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--node-rank", type=int, default=0)
    ap.add_argument("--master", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--min-bytes", type=int, default=8)
    ap.add_argument("--max-bytes", type=int, default=0, help="default 256 MiB with NCCL, 4 MiB with gloo")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--inject-wrong", default="", metavar="COLLECTIVE")
    ap.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)  # the local rank, in a child
    a = ap.parse_args(argv)
    a.collectives = [c for c in a.collectives.split(",") if c]
    a.world = a.ranks * a.nodes
    unknown = [c for c in a.collectives if c not in COLLECTIVES]
    if unknown:
        ap.error(f"unknown collectives {unknown}: choose from {', '.join(COLLECTIVES)}")

    if a.worker >= 0:
        rank = a.node_rank * a.ranks + a.worker
        try:
            doc = run_rank(a, rank, a.worker)
        except Exception as e:  # noqa: BLE001  (any failure of a rank, in its own words, reaches the merged document)
            doc = {"rank": rank, "world": a.world, "backend": a.backend, "error": f"{type(e).__name__}: {e}"}
        print(LINE + json.dumps(doc), flush=True)
        return 1 if doc.get("error") else 0

    if a.backend == "auto" or (a.backend == "nccl" and not a.ranks):
        import torch  # here only to count GPUs: each rank imports its own

        if a.backend == "auto":
            a.backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "gloo"
        if not a.ranks:
            a.ranks = torch.cuda.device_count() if a.backend == "nccl" else 2
    if not a.ranks and a.backend == "gloo":
        a.ranks = 2
    if not a.ranks:
        ap.error("--backend nccl: torch sees no GPU here")
    if not a.max_bytes:
        a.max_bytes = (256 << 20) if a.backend == "nccl" else (4 << 20)
    world = a.world = a.ranks * a.nodes
    if not 1 <= world <= MAX_RANKS:
        ap.error(f"{world} ranks: the int32 sums hold 1..{MAX_RANKS}")
    if a.nodes > 1 and not a.port:
        ap.error("--nodes > 1 needs --port (and --master) that every node names alike")
    port = a.port or free_port()
    base = [
        sys.executable,
        os.path.abspath(__file__),
        "--backend",
        a.backend,
        "--ranks",
        str(a.ranks),
        "--nodes",
        str(a.nodes),
        "--node-rank",
        str(a.node_rank),
        "--master",
        a.master,
        "--port",
        str(port),
        "--min-bytes",
        str(a.min_bytes),
        "--max-bytes",
        str(a.max_bytes),
        "--iters",
        str(a.iters),
        "--timeout",
        str(a.timeout),
        "--collectives",
        ",".join(a.collectives),
        "--inject-wrong",
        a.inject_wrong,
    ]
    procs = [
        subprocess.Popen(base + ["--worker", str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(a.ranks)
    ]
    docs, failed = [], False
    for i, p in enumerate(procs):
        try:
            stdout, stderr = p.communicate(timeout=a.timeout + 60)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        lines = [ln[len(LINE) :] for ln in stdout.splitlines() if ln.startswith(LINE)]
        if lines:
            docs.append(json.loads(lines[-1]))
        else:
            docs.append(
                {
                    "rank": a.node_rank * a.ranks + i,
                    "world": world,
                    "backend": a.backend,
                    "error": f"exit {p.returncode}, no result: {stderr.strip()[-600:]}",
                }
            )
        failed = failed or p.returncode != 0
    if a.nodes > 1:
        for d in docs:
            print(LINE + json.dumps(d), flush=True)
        return 1 if failed else 0
    doc = merge(docs)
    print(json.dumps(doc), flush=True)
    return 0 if doc["ok"] and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
