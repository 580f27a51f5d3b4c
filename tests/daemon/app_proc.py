"""A throwaway application process for the daemon tests (run as a script, killed by them).

`python app_proc.py SOCKET hold SIZE`: registers a region of SIZE bytes, prints its handle as
one JSON line, then waits forever (the test kills it with SIGKILL).
`python app_proc.py SOCKET write PEER HANDLE_JSON`: registers a 1 MiB source, connects to PEER,
prints "writing", then posts 1 MiB WRITEs to the handle as fast as completions allow, forever.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path

# Run as a script, outside the test package: its sibling module by path.
sys.path.insert(0, str(Path(__file__).resolve().parent))
daemonproc = importlib.import_module("daemonproc")
Memfd, RawClient = daemonproc.Memfd, daemonproc.RawClient


def main() -> None:
    path, mode = sys.argv[1], sys.argv[2]
    client = RawClient(path)
    if mode == "hold":
        mem = Memfd(int(sys.argv[3]))
        result = mem.register(client, "held")
        print(json.dumps(result["handle"]), flush=True)
        while True:
            time.sleep(1)
    peer, handle = sys.argv[3], json.loads(sys.argv[4])
    mem = Memfd(1 << 20)
    src = mem.register(client, "src")["region"]
    conn = client.call("connect", {"peer": peer})["connection"]
    print("writing", flush=True)
    write = {"region": src, "offset": 0, "length": 1 << 20, "remote": handle}
    while True:
        client.call("write", {"connection": conn, "writes": [write] * 8})
        client.call("completions", {"connection": conn, "timeout": 1})


if __name__ == "__main__":
    main()
