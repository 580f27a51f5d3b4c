"""Ring all-gather through mrc daemons: one process per host, each talking to its own daemon.

    python -m tools.examples.allgather --socket /run/mrc/mrc.sock --rank 0 \\
        --hosts h1,h2,h3,h4 --size 64M

Every rank owns `size` bytes (a seeded pattern, chunk `rank` of a region of `hosts × size`
bytes). In W - 1 steps each rank WRITEs one chunk into the next rank's region at that chunk's
offset: first its own, then the one it received in the step before, so after the last step
every region holds every chunk. A chunk goes as WRITEs of `--write` bytes posted with
`write_many`, its last one a WRITE_WITH_IMM carrying the chunk number: the immediate is raised
only once every packet up to it has landed, so it says the whole chunk is there. Then every
rank checks all W chunks byte for byte and prints one JSON line.

The ranks find each other's regions through the daemons (docs/DESIGN.md §9): each sends
its region handle to the rank before it (the one that writes into it) on the message endpoint
"allgather" and repeats it until that rank acknowledges, since the other may not have bound
the endpoint yet. No side channel.

`allgather_testbed` runs this on the clos netns testbed with a daemon per host and a fault.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import deque
from typing import Any

from mrc.client import Client, ClientError, Connection, Region, RegionHandle, Write, rpc
from mrc.units import parse_size

ENDPOINT = "allgather"
#: Writes kept in flight per connection, and posted per request.
WINDOW = 64
BATCH = 32
RESEND = 0.5


class AllGatherError(Exception):
    """The all-gather could not finish; one line."""


def chunk_bytes(seed: int, chunk: int, size: int) -> bytes:
    """What rank `chunk` contributes: a stream seeded by (seed, chunk)."""
    return random.Random(seed * 1_000_003 + chunk).randbytes(size)


def _send(client: Client, peer: str, **msg: Any) -> None:
    client.send_message(peer, ENDPOINT, json.dumps(msg).encode())


def swap_handles(client: Client, rank: int, prev: str, next_host: str, region: Region,
                 timeout: float) -> RegionHandle:
    """Give our handle to `prev` (it writes into us) until it acknowledges; take `next_host`'s
    handle (we write into it) and acknowledge each copy. Returns next's handle."""
    deadline = time.monotonic() + timeout
    theirs: RegionHandle | None = None
    acked = False
    last_sent = 0.0
    while theirs is None or not acked:
        now = time.monotonic()
        if now > deadline:
            missing = "no handle from " + next_host if theirs is None else f"{prev} never acked"
            raise AllGatherError(f"handle exchange timed out after {timeout:g} s: {missing}")
        if not acked and now - last_sent >= RESEND:
            try:
                _send(client, prev, op="handle", rank=rank, handle=region.handle.to_dict())
            except ClientError as exc:
                # The peer daemon may still be starting, or its app not bound yet: try again.
                # Only losing our own daemon ends the exchange.
                if exc.code in (rpc.CLOSED, rpc.UNREACHABLE):
                    raise
            last_sent = now
        msg = client.recv_message(ENDPOINT, timeout=0.1)
        if msg is None:
            continue
        try:
            obj = json.loads(msg.data)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if obj.get("op") == "handle" and msg.peer == next_host:
            theirs = RegionHandle.from_dict(obj.get("handle"))
            _send(client, next_host, op="ack", rank=rank)
        elif obj.get("op") == "ack" and msg.peer == prev:
            acked = True
    return theirs


def write_chunk(conn: Connection, region: Region, remote: RegionHandle, chunk: int, size: int,
                piece: int) -> int:
    """WRITE chunk `chunk` into the same offset of `remote`; the last piece carries the chunk
    number as its immediate. Returns bytes completed; raises on an error completion."""
    base = chunk * size
    pieces = [(off, min(piece, size - off)) for off in range(0, size, piece)]
    pending: deque[int] = deque()
    done = 0
    i = 0
    while i < len(pieces) or pending:
        batch: list[Write] = []
        while i < len(pieces) and len(pending) + len(batch) < WINDOW and len(batch) < BATCH:
            off, length = pieces[i]
            last = i == len(pieces) - 1
            batch.append(Write(region, base + off, length, remote, base + off,
                               imm=chunk if last else None))
            i += 1
        if batch:
            pending.extend(conn.write_many(batch))
        for c in conn.poll(timeout=0 if batch else 0.05):
            pending.popleft()
            if not c.ok:
                raise AllGatherError(f"a WRITE of chunk {chunk} ended {c.status}")
            done += c.bytes
    return done


def run_rank(sock: str, rank: int, hosts: list[str], size: int, piece: int, seed: int,
             timeout: float) -> dict[str, Any]:
    world = len(hosts)
    prev, next_host = hosts[(rank - 1) % world], hosts[(rank + 1) % world]
    with Client(sock) as client:
        me = client.status().get("host")
        if me != hosts[rank]:
            raise AllGatherError(f"rank {rank} is {hosts[rank]} but the daemon at {sock} is {me}")
        client.bind(ENDPOINT)
        region = client.register_region(world * size, f"allgather-{rank}")
        region.buf[rank * size:(rank + 1) * size] = chunk_bytes(seed, rank, size)
        remote = swap_handles(client, rank, prev, next_host, region, timeout)
        start = time.monotonic()
        written = 0
        arrived: set[int] = set()
        with client.connect(next_host) as conn:
            for step in range(world - 1):
                written += write_chunk(conn, region, remote, (rank - step) % world, size, piece)
                want = (rank - step - 1) % world
                while want not in arrived:
                    if time.monotonic() - start > timeout:
                        raise AllGatherError(f"chunk {want} from {prev} never arrived")
                    for imm in client.wait_immediates(region, timeout=0.5):
                        if imm.peer == prev:
                            arrived.add(imm.imm)
        seconds = time.monotonic() - start
        bad = [c for c in range(world)
               if region.buf[c * size:(c + 1) * size] != chunk_bytes(seed, c, size)]
        region.close()
    return {"rank": rank, "host": me, "verified": not bad, "bad_chunks": bad,
            "bytes_written": written, "seconds": round(seconds, 3),
            "goodput_bps": written * 8 / seconds if seconds else 0.0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.examples.allgather",
                                description="Ring all-gather through mrc daemons (one rank).")
    p.add_argument("--socket", required=True, help="this host's daemon control socket")
    p.add_argument("--rank", type=int, required=True, help="this process's place in --hosts")
    p.add_argument("--hosts", required=True,
                   help="the daemons' host names, in ring order (comma-separated)")
    p.add_argument("--size", type=parse_size, default=64 << 20, help="bytes per rank (64M)")
    p.add_argument("--write", type=parse_size, default=1 << 20, help="bytes per WRITE (1M)")
    p.add_argument("--seed", type=int, default=1, help="pattern seed (same on every rank)")
    p.add_argument("--timeout", type=float, default=120.0, help="give up after this (120 s)")
    ns = p.parse_args(argv)
    hosts = [h.strip() for h in ns.hosts.split(",") if h.strip()]
    if len(hosts) < 2 or len(set(hosts)) != len(hosts) or not 0 <= ns.rank < len(hosts):
        p.error("--hosts needs at least 2 distinct names and --rank one of their places")
    try:
        result = run_rank(ns.socket, ns.rank, hosts, ns.size, ns.write, ns.seed, ns.timeout)
    except (ClientError, AllGatherError) as exc:
        print(json.dumps({"rank": ns.rank, "verified": False, "error": str(exc)}), flush=True)
        sys.stderr.write(f"allgather rank {ns.rank}: {exc}\n")
        return 1
    print(json.dumps(result), flush=True)
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
