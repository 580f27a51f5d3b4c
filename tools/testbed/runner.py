"""Running `ip`, `tc`, `nft` and `sysctl`: batching, `--print-commands`, root and tool checks.

Holds `Runner`, through which every command of the testbed goes, so `--print-commands` shows
each one (batched lines are printed as the standalone command they stand for), and the checks
for root (`require_root`, with the `MRC_TESTBED_EUID` override for tests) and for the tools
(`ensure_tools`, which installs iproute2/nftables with apt-get when root). What to run is decided
by `build` and `faults`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence

from tools.testbed.model import TestbedError

NOT_ROOT = "needs root (network namespaces); run as root or with sudo"
# tool → Debian package that provides it
PACKAGES = {"ip": "iproute2", "tc": "iproute2", "nft": "nftables"}


def euid() -> int:
    """The effective uid, or `MRC_TESTBED_EUID` when set (tests simulate a normal user)."""
    forced = os.environ.get("MRC_TESTBED_EUID")
    if forced is not None:
        try:
            return int(forced)
        except ValueError:
            raise TestbedError(f"MRC_TESTBED_EUID={forced!r} is not an integer") from None
    return os.geteuid()


def require_root() -> None:
    if euid() != 0:
        raise TestbedError(NOT_ROOT, code=2)


def ensure_tools(tools: Sequence[str], runner: Runner) -> None:
    """Make sure each tool is on PATH, installing its package with apt-get when root."""
    missing = sorted({PACKAGES[t] for t in tools if shutil.which(t) is None})
    if not missing:
        return
    if euid() != 0 or shutil.which("apt-get") is None:
        raise TestbedError(f"missing {' '.join(missing)}; install it (apt-get install "
                           f"{' '.join(missing)}) or run as root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    print(f"testbed: installing {' '.join(missing)} with apt-get", file=sys.stderr)
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
    if runner.run(install, check=False, env=env).returncode != 0:
        runner.run(["apt-get", "update", "-qq"], check=False, env=env)
        if runner.run(install, check=False, env=env).returncode != 0:
            raise TestbedError(f"apt-get could not install {' '.join(missing)}")
    still = [t for t in tools if shutil.which(t) is None]
    if still:
        raise TestbedError(f"{' '.join(still)} still missing after installing {' '.join(missing)}")


def _failed(proc: subprocess.CompletedProcess[str]) -> TestbedError:
    """The error for a command that failed: the command and the first line it printed."""
    argv = [str(a) for a in proc.args]
    msg = (proc.stderr or proc.stdout).strip().splitlines()
    detail = msg[0] if msg else f"exit status {proc.returncode}"
    return TestbedError(f"{shlex.join(argv[:6])}{' …' if len(argv) > 6 else ''}: {detail}")


class Runner:
    """Runs commands, echoing each to stderr as `+ cmd` when `print_commands` is set."""

    def __init__(self, print_commands: bool = False) -> None:
        self.print_commands = print_commands

    def show(self, line: str) -> None:
        if self.print_commands:
            print(f"+ {line}", file=sys.stderr, flush=True)

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        input: str | None = None,
        env: dict[str, str] | None = None,
        show: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` and capture its output; on failure with `check`, raise `TestbedError`
        naming the command and the first line of its error output."""
        if show:
            self.show(shlex.join(argv))
        try:
            proc = subprocess.run(
                list(argv), input=input, capture_output=True, text=True, env=env, check=False
            )
        except FileNotFoundError:
            raise TestbedError(f"{argv[0]}: command not found") from None
        if check and proc.returncode != 0:
            raise _failed(proc)
        return proc

    def batch(
        self, tool: str, lines: Sequence[str], ns: str | None = None, *, force: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run `lines` through one `ip -batch` (or `tc -batch`), inside namespace `ns` if given.

        With `force`, the batch goes on past failing lines (used where a line may fail
        harmlessly, e.g. deleting a qdisc that is not there) and nothing is raised.
        """
        if not lines:
            return subprocess.CompletedProcess([tool], 0, "", "")
        head = [tool] + (["-n", ns] if ns else [])
        for line in lines:
            self.show(f"{shlex.join(head)} {line}")
        argv = head + (["-force"] if force else []) + ["-batch", "-"]
        return self.run(argv, check=not force, input="\n".join(lines) + "\n", show=False)

    def nft(self, ns: str, script: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run an nft script (one transaction) inside namespace `ns`."""
        for line in script.strip().splitlines():
            self.show(f"ip netns exec {ns} nft {shlex.quote(line.strip())}")
        argv = ["ip", "netns", "exec", ns, "nft", "-f", "-"]
        return self.run(argv, check=check, input=script, show=False)

    def armed_nft(self, ns: str) -> Armed:
        """An `nft -f -` inside namespace `ns`, started now, that acts when fired."""
        return Armed(self, ["ip", "netns", "exec", ns, "nft", "-f", "-"],
                     lambda line: f"ip netns exec {ns} nft {shlex.quote(line)}")

    def armed_batch(self, tool: str, ns: str) -> Armed:
        """An `ip -batch -` (or `tc -batch -`) inside namespace `ns`, started now, that acts
        when fired."""
        return Armed(self, [tool, "-n", ns, "-batch", "-"], lambda line: f"{tool} -n {ns} {line}")

    def sysctl(self, ns: str, settings: Sequence[tuple[str, str]]) -> None:
        argv = ["ip", "netns", "exec", ns, "sysctl", "-q", "-w"]
        argv += [f"{k}={v}" for k, v in settings]
        self.run(argv)


class Armed:
    """A command started ahead of the moment it must act, blocked reading its script on stdin.

    Starting `ip netns exec NS nft` costs a fork, two execs and the tool's start-up: 4-6 ms
    on an idle 2-core host, 18-28 ms for both ends of a link (one after the other) while a
    transfer keeps both cores busy. That start-up competes for the CPU with the very transfer
    whose reaction to the fault is being measured, and the two ends fail that far apart.
    `fire` only writes the script and closes stdin, so the ends fail within about a
    millisecond of each other; `wait` then collects the result as `Runner.run` would. An
    armed command never fired is ended by `cancel` (it reads an empty script, does nothing)."""

    def __init__(self, runner: Runner, argv: list[str], shown: Callable[[str], str]) -> None:
        self.runner = runner
        self.argv = argv
        self.shown = shown  # the standalone command a script line stands for
        try:
            self.proc: subprocess.Popen[str] | None = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True,
            )
        except FileNotFoundError:
            raise TestbedError(f"{argv[0]}: command not found") from None
        self.script = ""

    def fire(self, script: str) -> None:
        """Hand the command its script (it acts as soon as it has read it to the end)."""
        proc = self.proc
        if proc is None or proc.stdin is None:
            raise TestbedError(f"{shlex.join(self.argv[:6])}: already fired or cancelled")
        self.script = script
        try:
            proc.stdin.write(script)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it ended early: wait() reports its error
        for line in script.strip().splitlines():
            self.runner.show(self.shown(line.strip()))

    def wait(self, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The fired command's result; on failure with `check`, `TestbedError` naming it."""
        proc = self.proc
        if proc is None:
            raise TestbedError(f"{shlex.join(self.argv[:6])}: cancelled")
        self.proc = None
        proc.wait(timeout=60)
        out = proc.stdout.read() if proc.stdout is not None else ""
        err = proc.stderr.read() if proc.stderr is not None else ""
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
        done = subprocess.CompletedProcess(self.argv, proc.returncode, out, err)
        if check and done.returncode != 0:
            raise _failed(done)
        return done

    def cancel(self) -> None:
        """End a command that was never fired (or collect one that was)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
            return
        proc.kill()
        proc.wait()
