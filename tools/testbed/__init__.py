"""netns/veth testbeds for `mrc`: hosts and switches as network namespaces, links as veth
pairs, switches as static IPv6 routers with `seg6local End` SIDs, and a fault injector.

Run it as `python -m tools.testbed` (as root)::

    up TOPOLOGY [--name N] [--planes P] [--hosts H] [--racks R] [--tier1 K] [--print-commands]
    down [NAME | --all]          list
    status [NAME] [-J]           paths [NAME] [-o FILE]
    exec [--name N] NODE -- CMD…
    fault [--name N] link-down LINK | link-up LINK | flap LINK --period MS --count N
          [--background] | loss LINK PERCENT | blackhole LINK | rate LINK RATE | clear [LINK]

TOPOLOGY is a name in `topologies/` (`pair`, `clos`) or a path to a TOML file; see
`topology` for the file format, node and link names and the addressing plan.

Names: a testbed is `tb<random hex>` unless `--name` says otherwise; node X lives in the
namespace `mrc-<testbed>-X`. Links: `h<N>-p<plane>` joins host N to its tier-0 (in `pair`, to
the other host), `<tier0>-<tier1>` (e.g. `t0r1p0-t1ap0`) joins two switches, and a fault can
name a single end as `node:iface` (`t0r1p0:h1`). Interfaces: a host's interface on plane p is
`p<p>`; a switch names each interface after the node at its other end.

State: `/run/mrc-testbed/<testbed>.json` records what was created (written before anything is
built), so `down --all` removes everything even after a crash, and also removes namespaces
that start with the prefix but have no state file. Nothing outside the tool's own namespaces is
changed: veth pairs are created directly inside them.

Path table (`paths`, and `status -J` under `paths`), read by `mrc bench --paths FILE`::

    {"version": 1, "testbed": NAME, "entries": [
      {"src": ADDR, "dst": ADDR, "plane": P, "src_node": "h1", "dst_node": "h3",
       "paths": [{"name": "t1-0", "segments": [SID, …]}, …]}, …]}

One entry per ordered (source host, destination host, plane); segments are the SIDs in travel
order without the destination; same-rack (and `pair`) entries have one path `direct` with no
segments. `pair` lists IPv6 and IPv4 entries.

Environment (mostly for tests): `MRC_TESTBED_STATE_DIR` (state files), `MRC_TESTBED_PREFIX`
(namespace prefix, default `mrc-`), `MRC_TESTBED_EUID` (pretend to run with this euid).

Modules: `model` (dataclasses, path table), `topology` (TOML → model), `runner` (commands,
root and tool checks), `build` (up/down/state), `faults`, `report` (status), `cli`. Sending
MRC over the fabric (SRH sockets, `--paths`) is `mrc.io`'s and `mrc.cli`'s job.
"""
