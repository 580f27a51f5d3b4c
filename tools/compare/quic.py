"""A small aioquic bulk sender and receiver: one stream over one plane.

    python -m tools.compare.quic server --bind ADDR --port P [--timeout S]
    python -m tools.compare.quic client --connect ADDR --port P --bytes N [--max-seconds S]

The server makes a throw-away self-signed certificate (EC P-256, with `cryptography`) in
memory and serves one connection. The client (certificate checks off) opens one
bidirectional stream and writes `--bytes` zero bytes in 256 KiB pieces with
`send_stream_data`. aioquic buffers whatever it is given, so there is an application window:
the server answers with its running byte count (8 bytes, on the same stream) every 1 MiB,
and the client keeps at most 16 MiB beyond the last count in flight. If `--max-seconds`
passes first, the client ends the stream where it is (the JSON says `capped`), so the run
stays short when aioquic is slow; goodput is then over the bytes that did move.

Settings: `max_datagram_size` 8952 (the testbed's MTU 9000 less IPv4 and UDP headers, as a
tuned deployment on jumbo frames would use; aioquic does no path-MTU discovery),
connection and stream flow-control windows 32 MiB, aioquic's default congestion control
(Reno) and cipher choice, uvloop when installed. Each side prints one JSON line; the
server's has `bytes`, `first`/`last` (monotonic), `seconds`, `bits_per_second`, `capped`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import ssl
import struct
import sys
import time
from typing import Any

CHUNK = 256 << 10
ACK_EVERY = 1 << 20
WINDOW = 16 << 20
DATAGRAM = 8952
FLOW_WINDOW = 32 << 20


def _config(is_client: bool) -> Any:
    from aioquic.quic.configuration import QuicConfiguration

    cfg = QuicConfiguration(is_client=is_client, alpn_protocols=["mrc-compare"],
                            max_datagram_size=DATAGRAM, idle_timeout=30.0)
    cfg.max_data = FLOW_WINDOW
    cfg.max_stream_data = FLOW_WINDOW
    if is_client:
        cfg.verify_mode = ssl.CERT_NONE
    else:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mrc-compare")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName("mrc-compare")]),
                               critical=False)
                .sign(key, hashes.SHA256()))
        cfg.certificate = cert
        cfg.private_key = key
    return cfg


async def _serve(bind: str, port: int, timeout: float) -> dict[str, Any]:
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.asyncio.server import serve
    from aioquic.quic.events import QuicEvent, StreamDataReceived

    done = asyncio.get_running_loop().create_future()
    st: dict[str, Any] = {"bytes": 0, "first": 0.0, "last": 0.0, "acked": 0}

    class Sink(QuicConnectionProtocol):
        def quic_event_received(self, event: QuicEvent) -> None:
            if not isinstance(event, StreamDataReceived):
                return
            t = time.monotonic()
            if event.data:
                st["bytes"] += len(event.data)
                st["last"] = t
                if not st["first"]:
                    st["first"] = t
            if event.end_stream or st["bytes"] - st["acked"] >= ACK_EVERY:
                st["acked"] = st["bytes"]
                self._quic.send_stream_data(event.stream_id, struct.pack("!Q", st["bytes"]),
                                            end_stream=event.end_stream)
                self.transmit()
            if event.end_stream and not done.done():
                done.set_result(None)

    server = await serve(bind, port, configuration=_config(False), create_protocol=Sink)
    print("READY", flush=True)
    try:
        await asyncio.wait_for(done, timeout)
        await asyncio.sleep(0.2)  # let the last count reach the client
    finally:
        server.close()
    seconds = st["last"] - st["first"]
    return {"bytes": st["bytes"], "first": st["first"], "last": st["last"], "seconds": seconds,
            "bits_per_second": st["bytes"] * 8 / seconds if seconds > 0 else 0.0}


async def _send(addr: str, port: int, nbytes: int, max_seconds: float) -> dict[str, Any]:
    from aioquic.asyncio.client import connect
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.quic.events import QuicEvent, StreamDataReceived

    st: dict[str, Any] = {"acked": 0, "tail": b"", "ended": False}
    progress = asyncio.Event()

    class Source(QuicConnectionProtocol):
        def quic_event_received(self, event: QuicEvent) -> None:
            if isinstance(event, StreamDataReceived):
                tail = st["tail"] + event.data
                whole = len(tail) // 8 * 8
                if whole:
                    st["acked"] = struct.unpack_from("!Q", tail, whole - 8)[0]
                st["tail"] = tail[whole:]
                st["ended"] = st["ended"] or event.end_stream
                progress.set()

    async with connect(addr, port, configuration=_config(True), create_protocol=Source) as proto:
        quic = proto._quic
        sid = quic.get_next_available_stream_id()
        data = bytes(CHUNK)
        sent = 0
        start = time.monotonic()
        capped = False
        while sent < nbytes:
            while sent - st["acked"] > WINDOW:
                progress.clear()
                await asyncio.wait_for(progress.wait(), 30)
            if time.monotonic() - start > max_seconds:
                capped = True
                break
            n = min(CHUNK, nbytes - sent)
            sent += n
            quic.send_stream_data(sid, data[:n], end_stream=sent >= nbytes)
            proto.transmit()
            await asyncio.sleep(0)
        if capped:
            quic.send_stream_data(sid, b"", end_stream=True)
            proto.transmit()
        while not st["ended"]:
            progress.clear()
            await asyncio.wait_for(progress.wait(), 30)
        seconds = time.monotonic() - start
    return {"bytes": sent, "acked": st["acked"], "seconds": seconds, "capped": capped}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.compare.quic")
    sub = p.add_subparsers(dest="role", required=True)
    s = sub.add_parser("server")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--timeout", type=float, default=120.0)
    c = sub.add_parser("client")
    c.add_argument("--connect", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--bytes", type=int, required=True)
    c.add_argument("--max-seconds", type=float, default=1e9)
    a = p.parse_args(argv)
    try:
        import aioquic  # noqa: F401
    except ImportError:
        print("quic: aioquic is not installed (pip install aioquic)", file=sys.stderr)
        return 1
    run: Any = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        run = uvloop.run
    try:
        if a.role == "server":
            doc = run(_serve(a.bind, a.port, a.timeout))
        else:
            doc = run(_send(a.connect, a.port, a.bytes, a.max_seconds))
    except (OSError, TimeoutError, ConnectionError) as e:
        print(f"quic {a.role}: {e.__class__.__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
