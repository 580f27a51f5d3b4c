"""`python -m tools.testbed`: the command line (argparse) over `build`, `faults` and `report`.

Holds argument parsing, the dispatch to the subcommands, and the error rule: anything wrong is
one line on stderr (`testbed: …`) and a non-zero exit (2 for usage and for a missing root),
never a traceback. Input is validated before anything is changed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from tools.testbed import build, faults, report, topology
from tools.testbed.model import TestbedError
from tools.testbed.runner import Runner, ensure_tools, require_root


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"testbed: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--print-commands", action="store_true", default=argparse.SUPPRESS,
                        help="show every ip/tc/nft/sysctl command run (on stderr, as `+ cmd`)")
    p = _Parser(prog="python -m tools.testbed", parents=[common],
                description="netns/veth testbeds with a static SRv6 fabric, and faults.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=_Parser)

    s = sub.add_parser("up", parents=[common], help="build a topology")
    s.add_argument("topology", help=f"a name ({', '.join(topology.available())}) or a .toml path")
    s.add_argument("--name", help="testbed name (default tb<random hex>)")
    for key in ("planes", "hosts", "racks", "tier1", "ecmp"):
        s.add_argument(f"--{key}", type=int, help=f"override params.{key}")

    s = sub.add_parser("down", parents=[common], help="remove a testbed, or all of them")
    s.add_argument("name", nargs="?")
    s.add_argument("--all", action="store_true",
                   help="every testbed and every leftover namespace with our prefix")

    sub.add_parser("list", parents=[common], help="names of the testbeds that are up")

    s = sub.add_parser("status", parents=[common], help="nodes, links, addresses, SIDs, states")
    s.add_argument("name", nargs="?")
    s.add_argument("-J", "--json", action="store_true", help="one JSON document")

    s = sub.add_parser("paths", parents=[common], help="the path table (for mrc bench --paths)")
    s.add_argument("name", nargs="?")
    s.add_argument("-o", "--output", help="write it to this file (default stdout)")

    s = sub.add_parser("exec", parents=[common], help="run a command in a node's namespace")
    s.add_argument("--name", help="testbed (default: the only one)")
    s.add_argument("node")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG…]")

    f = sub.add_parser("fault", parents=[common], help="inject or clear faults")
    f.add_argument("--name", help="testbed (default: the only one)")
    fsub = f.add_subparsers(dest="fault", required=True, metavar="FAULT", parser_class=_Parser)
    for verb, text in (("link-down", "set both ends (or node:iface) down"),
                       ("link-up", "set them up again, restoring routes"),
                       ("blackhole", "drop everything arriving (nftables)")):
        fsub.add_parser(verb, parents=[common], help=text).add_argument("link")
    s = fsub.add_parser("flap", parents=[common], help="down/up cycles")
    s.add_argument("link")
    s.add_argument("--period", type=int, required=True, metavar="MS", help="one down+up cycle")
    s.add_argument("--count", type=int, required=True, help="cycles (0: until cleared)")
    s.add_argument("--background", action="store_true", help="run detached; clear stops it")
    s = fsub.add_parser("loss", parents=[common], help="random loss (nftables numgen)")
    s.add_argument("link")
    s.add_argument("percent", type=float)
    s = fsub.add_parser("rate", parents=[common], help="rate limit (tbf), e.g. 100mbit")
    s.add_argument("link")
    s.add_argument("rate")
    s.add_argument("--latency", default=build.TBF_LATENCY,
                   help=f"tbf latency: the most queueing it allows (default {build.TBF_LATENCY})")
    s = fsub.add_parser("clear", parents=[common], help="undo faults on a link, or all")
    s.add_argument("link", nargs="?")
    return p


def _up(args: argparse.Namespace, runner: Runner) -> int:
    overrides = {k: getattr(args, k) for k in ("planes", "hosts", "racks", "tier1", "ecmp")
                 if getattr(args, k) is not None}
    topo = topology.load(args.topology, overrides)  # validated before anything changes
    if args.name:
        build.check_name(args.name)
    require_root()
    t0 = time.monotonic()
    state = build.up(topo, args.name, runner)
    params = " ".join(f"{k}={v}" for k, v in topo.params.items())
    print(f"testbed {state.name} up: {topo.name}{' (' + params + ')' if params else ''}, "
          f"{len(topo.nodes)} namespaces, {len(topo.links)} links in "
          f"{time.monotonic() - t0:.2f} s")
    print(f"  status: python -m tools.testbed status {state.name}    "
          f"down: python -m tools.testbed down {state.name}")
    return 0


def _down(args: argparse.Namespace, runner: Runner) -> int:
    if args.all and args.name:
        raise TestbedError("down takes a NAME or --all, not both", code=2)
    if args.name:
        build.check_name(args.name)
    require_root()
    ensure_tools(["ip"], runner)
    if args.all:
        removed = build.down_all(runner)
        if not removed:
            print("no testbeds")
        for name, n in sorted(removed.items()):
            print(f"testbed {name} down: removed {n} namespaces")
        return 0
    name = args.name or build.resolve(None).name
    n = build.down(name, runner)
    print(f"testbed {name} down: removed {n} namespaces")
    return 0


def _status(args: argparse.Namespace, runner: Runner) -> int:
    state = build.resolve(args.name)
    require_root()
    doc = report.status_doc(state, build.link_states(state, runner))
    print(json.dumps(doc, indent=1) if args.json else report.status_text(doc))
    return 0


def _paths(args: argparse.Namespace, runner: Runner) -> int:
    state = build.resolve(args.name)
    text = json.dumps(state.topo.path_table(state.name), indent=1) + "\n"
    if args.output:
        try:
            with open(args.output, "w") as fh:
                fh.write(text)
        except OSError as e:
            raise TestbedError(f"{args.output}: {e.strerror}") from None
        n = len(state.topo.entries)
        print(f"testbed {state.name}: {n} path entries written to {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def _exec(args: argparse.Namespace, runner: Runner) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise TestbedError("exec needs a command: exec NODE -- CMD [ARG…]", code=2)
    state = build.resolve(args.name)
    if args.node not in state.topo.nodes:
        nodes = ", ".join(state.topo.nodes)
        raise TestbedError(f"unknown node '{args.node}' in testbed {state.name} ({nodes})")
    require_root()
    argv = ["ip", "netns", "exec", state.ns(args.node), *command]
    runner.show(shlex.join(argv))
    sys.stdout.flush()
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        raise TestbedError(f"exec: {e.strerror}") from None


def _fault(args: argparse.Namespace, runner: Runner) -> int:
    state = build.resolve(args.name)
    link: str = getattr(args, "link", None) or ""
    if link:
        faults.target(state, link)  # an unknown link fails before the root check
    require_root()
    ensure_tools(["ip", "tc"], runner)
    verb = args.fault
    if verb == "link-down":
        msg = faults.link_down(state, link, runner)
    elif verb == "link-up":
        msg = faults.link_up(state, link, runner)
    elif verb == "flap":
        msg = faults.flap(state, link, args.period, args.count, runner, args.background)
    elif verb == "loss":
        msg = faults.loss(state, link, args.percent, runner)
    elif verb == "blackhole":
        msg = faults.blackhole(state, link, runner)
    elif verb == "rate":
        msg = faults.rate(state, link, args.rate, runner, args.latency)
    else:
        msg = faults.clear(state, link or None, runner)
    print(f"testbed {state.name}: {msg}")
    return 0


COMMANDS: dict[str, Any] = {
    "up": _up,
    "down": _down,
    "status": _status,
    "paths": _paths,
    "exec": _exec,
    "fault": _fault,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    runner = Runner(getattr(args, "print_commands", False))
    try:
        if args.cmd == "list":
            for name in build.names():
                print(name)
            return 0
        return int(COMMANDS[args.cmd](args, runner))
    except TestbedError as e:
        print(f"testbed: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("testbed: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
