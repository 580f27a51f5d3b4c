"""`mrc keygen`: make a static X25519 identity for secured connections (docs/DESIGN.md §8).

`mrc keygen FILE` writes a new private key to FILE with mode 0600 (never over an existing file)
and prints its public key in base64, which is what peers list (`mrc bench --peer-key`, the
daemon's allowlist); `mrc keygen --public FILE` prints the public key of an existing key file,
as `wg pubkey` does. Key file rules and formats live in `mrc.node.keys`; this module only parses
arguments and prints.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mrc.cli import COMMANDS
from mrc.node import NodeError
from mrc.node.keys import create_private_key, load_private_key, public_key_text


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "keygen",
        help=COMMANDS["keygen"],
        description="Write a new X25519 private key to FILE (mode 0600; an existing file is "
        "never overwritten) and print its public key in base64. With --public, print the "
        "public key of the existing key FILE instead.",
    )
    p.add_argument("file", metavar="FILE", help="the private key file")
    p.add_argument(
        "--public",
        action="store_true",
        help="print the public key of an existing key file; write nothing",
    )
    p.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    try:
        key = load_private_key(ns.file) if ns.public else create_private_key(ns.file)
    except NodeError as exc:
        sys.stderr.write(f"mrc keygen: error: {exc}\n")
        return 1
    sys.stdout.write(public_key_text(key) + "\n")
    return 0
