"""What `status` shows: one testbed's nodes, interfaces, addresses, SIDs, links (with live
states and active faults) and path table, as a JSON document or as text.

Gathering live link states is `build.link_states`; the path table comes from the model.
"""

from __future__ import annotations

from typing import Any

from tools.testbed.build import State
from tools.testbed.topology import format_rate

LINK_NAMES = {
    "pair": "h1-p<plane> joins h1:p<plane> and h2:p<plane>",
    "clos": "h<N>-p<plane> joins host N to its tier-0; <tier0>-<tier1> (e.g. t0r1p0-t1ap0) "
    "joins two switches",
    "custom": "as named in the topology file (default <node a>-<node b>)",
}
NAMING = {
    "namespaces": "<prefix><testbed>-<node>",
    "ends": "a fault may name one end of a link as node:iface (e.g. t0r1p0:h1)",
    "interfaces": "a host's interface on plane p is p<p>; a switch's interface is named after "
    "the node at its other end",
}


def _fault_text(faults: dict[str, Any]) -> str:
    words = []
    if faults.get("down"):
        words.append("down")
    if "loss" in faults:
        words.append(f"loss {faults['loss']:g}%")
    if faults.get("blackhole"):
        words.append("blackhole")
    if "rate" in faults:
        words.append(f"rate {format_rate(faults['rate'])}")
    return " ".join(words)


def status_doc(state: State, live: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The `status -J` document."""
    topo = state.topo
    nodes = []
    for node in topo.nodes.values():
        nodes.append({
            "name": node.name,
            "role": node.role,
            "rack": node.rack,
            "plane": node.plane,
            "sid": node.sid,
            "namespace": state.ns(node.name),
            "interfaces": [
                {
                    "name": i.name,
                    "link": i.link,
                    "plane": i.plane,
                    "peer": f"{i.peer_node}:{i.peer_iface}",
                    "addresses": list(i.addrs),
                    "state": live.get(node.name, {}).get(i.name, "MISSING"),
                }
                for i in node.ifaces.values()
            ],
        })
    links = []
    for link in topo.links.values():
        ends = {str(e): live.get(e.node, {}).get(e.iface, "MISSING") for e in link.ends}
        faults = {e: state.faults[e] for e in ends if e in state.faults}
        links.append({
            "name": link.name,
            "a": str(link.a),
            "b": str(link.b),
            "plane": link.plane,
            "mtu": link.mtu,
            "rate": link.rate,
            "state": "up" if all(s == "UP" for s in ends.values()) else "down",
            "ends": ends,
            "faults": faults,
            "flapping_pid": state.flaps.get(link.name),
        })
    return {
        "name": state.name,
        "state": state.data.get("state"),
        "created": state.data.get("created"),
        "prefix": state.data.get("prefix"),
        "topology": {
            "name": topo.name,
            "kind": topo.kind,
            "source": topo.source,
            "params": topo.params,
        },
        "naming": {"links": LINK_NAMES[topo.kind], **NAMING},
        "nodes": nodes,
        "links": links,
        "sids": {n.name: n.sid for n in topo.nodes.values() if n.sid},
        "paths": topo.path_table(state.name),
    }


def status_text(doc: dict[str, Any]) -> str:
    topo = doc["topology"]
    params = " ".join(f"{k}={v}" for k, v in topo["params"].items())
    kind = "" if topo["kind"] == topo["name"] else f"{topo['kind']}"
    detail = ": ".join(x for x in (kind, params) if x)
    out = [
        f"testbed {doc['name']}: {topo['name']}{f' ({detail})' if detail else ''}, "
        f"{doc['state']} since {doc['created']}",
        f"namespaces: {doc['prefix']}{doc['name']}-<node>",
        f"links: {doc['naming']['links']}",
        f"       {doc['naming']['ends']}",
        "",
        "nodes",
    ]
    for node in doc["nodes"]:
        head = f"  {node['name']:<9} {node['role']:<6}"
        if node["rack"] is not None:
            head += f" rack {node['rack']}"
        if node["plane"] is not None:
            head += f" plane {node['plane']}"
        if node["sid"]:
            head += f"  sid {node['sid']}"
        out.append(head)
        for i in node["interfaces"]:
            addrs = " ".join(i["addresses"]) or "-"
            out.append(f"      {i['name']:<8} {addrs:<36} -> {i['peer']:<14} {i['state']}")
    out += ["", "links", f"  {'NAME':<16} {'A':<12} {'B':<12} {'MTU':>5} {'RATE':>8}  "
            f"{'STATE':<5}  FAULTS"]
    for link in doc["links"]:
        faults = "; ".join(f"{e} {_fault_text(f)}" for e, f in link["faults"].items())
        if link["flapping_pid"]:
            faults = (faults + "; " if faults else "") + f"flapping (pid {link['flapping_pid']})"
        out.append(
            f"  {link['name']:<16} {link['a']:<12} {link['b']:<12} {link['mtu']:>5} "
            f"{format_rate(link['rate']):>8}  {link['state']:<5}  {faults or '-'}"
        )
    n = len(doc["paths"]["entries"])
    out += ["", f"paths: {n} entries (python -m tools.testbed paths {doc['name']} -o FILE)"]
    return "\n".join(out)
