#!/usr/bin/env python3
"""What a training script would build from its launch variables, without any framework: every
process reads RANK, WORLD_SIZE, LOCAL_RANK (and NODE_RANK, LOCAL_WORLD_SIZE where set) and
meets the others at MASTER_ADDR:MASTER_PORT the way torch's TCPStore does (rank 0 listens,
the others connect). Rank 0 gathers one entry per rank and sends the whole table back; each
process prints ``TBCONF {json}`` with its own view and the table, so the test can compare every
variable with the real topology (which container each rank ran in). Stdlib only: it runs on
base images that carry no framework. A world that does not add up (two rank 0s, a missing
rank, a world of 1 inside a bigger job) ends in a timeout or a refused table, exit 1.
"""

import json
import os
import socket
import sys
import time

DEADLINE_S = 60


def fail(msg: str) -> None:
    print(f"rendezvous: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def env_int(name: str, required: bool = True):
    value = os.environ.get(name)
    if value is None:
        if required:
            fail(f"{name} is not set (the launch gave this process no {name})")
        return None
    try:
        return int(value)
    except ValueError:
        fail(f"{name}={value!r} is not an integer")


def read_line(conn: socket.socket) -> str:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf.decode()


def main() -> int:
    me = {
        "host": socket.gethostname(),
        "rank": env_int("RANK"),
        "world_size": env_int("WORLD_SIZE"),
        "local_rank": env_int("LOCAL_RANK"),
        "node_rank": env_int("NODE_RANK", required=False),
        "local_world_size": env_int("LOCAL_WORLD_SIZE", required=False),
        "master": f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}",
    }
    addr, port = os.environ.get("MASTER_ADDR"), env_int("MASTER_PORT")
    if not addr:
        fail("MASTER_ADDR is not set")
    deadline = time.monotonic() + DEADLINE_S
    if me["rank"] == 0:
        with socket.create_server(("", port), backlog=me["world_size"]) as server:
            server.settimeout(DEADLINE_S)
            peers, conns = [me], []
            try:
                while len(peers) < me["world_size"]:
                    conn, _ = server.accept()
                    conns.append(conn)
                    peers.append(json.loads(read_line(conn)))
            except TimeoutError:
                fail(
                    f"rank 0 saw {len(peers)} of WORLD_SIZE={me['world_size']} ranks within {DEADLINE_S} s: "
                    f"{sorted(p['rank'] for p in peers)}"
                )
            table = sorted(peers, key=lambda p: p["rank"])
            for conn in conns:
                conn.sendall((json.dumps(table) + "\n").encode())
                conn.close()
    else:
        while True:
            try:
                conn = socket.create_connection((addr, port), timeout=10)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    fail(f"rank {me['rank']}: no rank 0 at {addr}:{port} within {DEADLINE_S} s ({e})")
                time.sleep(0.2)
        with conn:
            conn.settimeout(DEADLINE_S)
            conn.sendall((json.dumps(me) + "\n").encode())
            try:
                table = json.loads(read_line(conn) or "null")
            except TimeoutError:
                fail(f"rank {me['rank']}: rank 0 at {addr}:{port} never sent the table")
        if table is None:
            fail(f"rank {me['rank']}: rank 0 at {addr}:{port} closed without a table")
    ranks = [p["rank"] for p in table]
    if ranks != list(range(me["world_size"])):
        fail(f"rank {me['rank']}: the gathered ranks are {ranks}, not 0..{me['world_size'] - 1}")
    os.write(1, ("TBCONF " + json.dumps({**me, "table": table}) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
