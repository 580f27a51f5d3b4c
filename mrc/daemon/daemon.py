"""The daemon process: start-up, signals, readiness, and the ordered shutdown.

`Daemon` wires the parts together on one event loop (uvloop when available): the host layer
(`mrc.node.Node`: plane sockets, SRv6 paths, the core endpoint), the `Service`, the control
socket dispatching to its `Methods`, the optional metrics endpoint and systemd notification.
`run_daemon(config, metrics)` is what `mrc daemon` calls; it returns the exit status.

Life cycle (docs/DAEMON.md): READY=1 once every socket is bound. SIGHUP re-reads the file and
takes its peer list (a file with a mistake is logged and ignored). SIGTERM or SIGINT: STOPPING=1,
stop accepting control clients and MRC connections, wait up to `drain_seconds` for in-flight
WRITEs to complete, fail the rest to their applications ("cancelled"), DISCONNECT every peer,
give the answers a moment to leave, close everything, remove the socket, exit 0. A second
signal skips the rest of the drain. Start-up failures are one line and exit status 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import resource
import signal

from mrc.core.endpoint import Endpoint
from mrc.core.memory import RegionTable
from mrc.core.secure.handshake import Identity
from mrc.io.loop import freeze_heap, new_event_loop
from mrc.node import Node, NodeError
from mrc.node.keys import load_or_create_private_key, load_psk, public_key_text

from .config import ConfigError, DaemonConfig, load_config, peer_keys
from .control import ControlError, ControlServer
from .methods import Methods
from .metrics import MetricsServer
from .notify import Notifier
from .service import Service

__all__ = ["Daemon", "DaemonError", "run_daemon"]

log = logging.getLogger("mrc.daemon")

#: Longest the answers of the last moment (cancelled completions) get to reach the clients.
ANSWER_GRACE = 0.5
HOUSEKEEPING = 1.0


class DaemonError(Exception):
    """The daemon cannot start (one line); exit status 1."""


class Daemon:
    def __init__(
        self,
        config: DaemonConfig,
        loop: asyncio.AbstractEventLoop,
        *,
        metrics: tuple[str, int] | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.config = config
        self.loop = loop
        self.metrics_addr = metrics if metrics is not None else config.metrics
        self.notifier = notifier if notifier is not None else Notifier()
        self.node: Node | None = None
        self.service: Service | None = None
        self.control: ControlServer | None = None
        self.metrics: MetricsServer | None = None
        self._stop = asyncio.Event()
        self._force = False
        self._housekeeping: asyncio.TimerHandle | None = None

    # -- start ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind everything; DaemonError (one line) when something cannot be served."""
        config = self.config
        identity = self._identity()
        _raise_fd_limit()
        rng = random.Random()
        # R_Keys come from the OS's generator: they are the only thing between a peer that
        # guessed one and an application's memory on an unsecured connection.
        regions = RegionTable(random.SystemRandom())
        try:
            service = Service(config, lambda on_event: Node(
                self.loop,
                [p.address for p in config.planes],
                config.port,
                table=config.path_table,
                payload_mtu=config.protocol.payload_mtu,
                serve=True,
                rng=rng,
                # QPNs, initial PSNs and nonces from the OS's generator (docs/DESIGN.md §8).
                endpoint=Endpoint(
                    rng=rng, regions=regions, identity=identity, ids=random.SystemRandom()
                ),
                on_event=on_event,
                on_error=self._io_error,
                interfaces=[p.interface for p in config.planes],
                secured=config.security != "none",
            ))
        except NodeError as exc:
            raise DaemonError(str(exc)) from None
        node = self.node = service.node
        self.service = service
        control = ControlServer(
            self.loop,
            config.control.socket,
            Methods(service),
            mode=config.control.mode,
            group=config.control.group,
            max_clients=config.limits.max_clients,
            max_clients_per_uid=config.limits.max_clients_per_uid,
            allowed_uids=config.control.allowed_uids,
            admin_uids=service.admin_uids,
            counters=service.control_counters,
        )
        try:
            control.start()
        except ControlError as exc:
            node.close()
            raise DaemonError(str(exc)) from None
        self.control = control
        if self.metrics_addr is not None:
            self.metrics = MetricsServer(service, control)
            host, port = self.metrics_addr
            try:
                bound = await self.metrics.start(host, port)
            except OSError as exc:
                self._close()
                raise DaemonError(
                    f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
                ) from None
            log.info("metrics on http://%s:%d/metrics", *bound)
        node.start()
        service.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self.request_stop)
        self.loop.add_signal_handler(signal.SIGHUP, self.reload)
        self._housekeeping = self.loop.call_later(HOUSEKEEPING, self._housekeep)
        planes = ", ".join(p.address for p in config.planes)
        log.info(
            "%s serving %s; planes %s port %d; %d peer(s); security %s",
            config.host, config.control.socket, planes, node.port, len(config.peers),
            config.security,
        )
        # Set-up objects leave the collector's walks (a full collection over them stalled
        # the data path for milliseconds; docs/DESIGN.md §11), as `mrc bench` does.
        freeze_heap()
        self.notifier.ready(f"serving {config.control.socket}")
        self.notifier.start_watchdog(self.loop)

    def _identity(self) -> Identity | None:
        """The host's key and the peers it accepts (docs/DESIGN.md §8); None with
        security = "none", which must be written in the file and is warned about."""
        config = self.config
        if config.security == "none":
            log.warning(
                "security = \"none\": connections are neither authenticated nor encrypted"
            )
            return None
        try:
            key, created = load_or_create_private_key(config.key_file)
            psk = load_psk(config.psk_file) if config.psk_file is not None else None
        except NodeError as exc:
            raise DaemonError(str(exc)) from None
        if created:
            log.info("created the key file %s", config.key_file)
        log.info("public key %s", public_key_text(key))
        return Identity(key, peer_keys(config.peers), psk)

    def _io_error(self, message: str) -> None:
        log.error("%s", message)

    def _housekeep(self) -> None:
        if self.service is not None:
            self.service.regions.unmapper.sweep()
        self._housekeeping = self.loop.call_later(HOUSEKEEPING, self._housekeep)

    # -- signals --------------------------------------------------------------------------------

    def request_stop(self) -> None:
        if self._stop.is_set():
            self._force = True  # a second signal: skip the rest of the drain
            return
        self._stop.set()

    def reload(self) -> None:
        if self.service is None:
            return
        try:
            fresh = load_config(self.config.path)
        except ConfigError as exc:
            log.error("reload of %s failed, peers unchanged: %s", self.config.path, exc)
            return
        if fresh.security != self.config.security:
            log.error("reload of %s: security cannot change while running; peers unchanged",
                      self.config.path)
            return
        identity = self.node.endpoint.identity if self.node is not None else None
        if identity is not None:
            identity.allowed_peers = frozenset(peer_keys(fresh.peers))
        peers, closed = self.service.reload_peers(fresh.peers)
        log.info("reloaded %s: %d peer(s), %d connection(s) closed", self.config.path, peers,
                 closed)

    # -- run and stop ---------------------------------------------------------------------------

    async def run(self) -> int:
        await self._stop.wait()
        await self.shutdown()
        return 0

    async def shutdown(self) -> None:
        service, control = self.service, self.control
        assert service is not None and control is not None
        self.notifier.stopping("draining")
        service.stop_accepting()
        control.stop_accepting()
        drain = self.config.limits.drain_seconds
        left = service.outstanding_writes()
        log.info("stopping: draining %d write(s) for up to %gs", left, drain)
        deadline = self.loop.time() + drain
        while service.outstanding_writes() and self.loop.time() < deadline and not self._force:
            await asyncio.sleep(0.005)
        left = service.outstanding_writes()
        service.close_all("daemon shutting down")
        for cs in list(service.clients.values()):
            service.wake(cs.id)
        # The cancelled completions and woken long-polls answer now: give the applications a
        # moment to fetch what is left and read their answers.
        deadline = self.loop.time() + ANSWER_GRACE
        while self.loop.time() < deadline and (
            any(c.unsent or c.waiting for c in control.clients.values())
            or any(any(cs.completions.values()) for cs in service.clients.values())
        ):
            await asyncio.sleep(0.005)
        if left:
            log.info("stopping: %d write(s) cancelled", left)
        self._close()
        log.info("stopped")

    def _close(self) -> None:
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            self._housekeeping = None
        self.notifier.stop_watchdog()
        if self.metrics is not None:
            self.metrics.close()
        if self.control is not None:
            self.control.close()
        if self.node is not None:
            self.node.close()
        if self.service is not None:
            self.service.close()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self.loop.remove_signal_handler(sig)


def _raise_fd_limit() -> None:
    """Take the hard limit on open files as the soft one: every client holds a socket and
    every mapped region an fd of its own (Python's mmap keeps a duplicate of the memfd)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run_daemon(config: DaemonConfig, metrics: tuple[str, int] | None = None) -> int:
    """Run until SIGTERM/SIGINT; the exit status (0 after a clean stop, 1 if it cannot start)."""
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    daemon = Daemon(config, loop, metrics=metrics)

    async def main() -> int:
        # Start and run in one run_until_complete: uvloop pauses its signal handling while
        # the loop is not running, so a SIGTERM between two of them (right after READY=1,
        # which start() sends) was lost and the daemon never stopped.
        try:
            await daemon.start()
        except DaemonError as exc:
            log.error("%s", exc)
            return 1
        return await daemon.run()

    try:
        return loop.run_until_complete(main())
    finally:
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
