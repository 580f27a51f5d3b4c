"""The Grafana dashboard of the mrc daemon's Prometheus metrics, built from one table of panels.

`python -m tools.grafana.dashboard` rewrites `tools/grafana/mrc-daemon.json` (checked in, so
it can be imported into Grafana as it is: Dashboards → New → Import). A test keeps the file
equal to what `build()` returns and checks every metric it queries against a live daemon's
scrape (tests/daemon/test_transfer.py).

Every panel's query uses only the families and labels `mrc/daemon/metrics.py` exposes (listed
in mrc/docs/DAEMON.md), filtered by the `instance` variable; rates use Grafana's
`$__rate_interval`. What it leaves to others: the metrics themselves (mrc/daemon/metrics.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("mrc-daemon.json")
UID = "mrc-daemon"
SEL = '{instance=~"$instance"}'
RATE = "[$__rate_interval]"

#: (row title, [(panel title, unit, [(PromQL, legend)], description)]) in display order.
Panel = tuple[str, str, list[tuple[str, str]], str]
ROWS: list[tuple[str, list[Panel]]] = [
    ("Traffic", [
        ("Received per plane", "bps", [
            (f"8 * sum by (plane) (rate(mrc_plane_bytes_received_total{SEL}{RATE}))",
             "plane {{plane}}")],
         "Bits per second each plane's socket received, every packet included."),
        ("Sent per plane", "bps", [
            (f"8 * sum by (plane) (rate(mrc_plane_bytes_sent_total{SEL}{RATE}))",
             "plane {{plane}}")],
         "Bits per second each plane's socket sent: data, retransmissions and control."),
        ("Sent per peer", "bps", [
            (f"8 * sum by (peer) (rate(mrc_peer_bytes_sent_total{SEL}{RATE}))", "{{peer}}")],
         "Bits per second of the connections to each peer, all planes."),
        ("Packets per plane", "pps", [
            (f"sum by (plane) (rate(mrc_plane_packets_received_total{SEL}{RATE}))",
             "received p{{plane}}"),
            (f"sum by (plane) (rate(mrc_plane_packets_sent_total{SEL}{RATE}))",
             "sent p{{plane}}")],
         "Datagrams per second on each plane's socket."),
    ]),
    ("Paths and planes", [
        ("Planes up", "none", [
            (f"min by (plane) (mrc_plane_up{SEL})", "plane {{plane}}")],
         "1 while a plane carries traffic; 0 once every connection has it down."),
        ("EVs by state", "none", [
            (f"sum by (state) (mrc_evs{SEL})", "{{state}}")],
         "EVs of the live connections: good, skip (penalised by ECN or a trim), assumed_bad "
         "(retired after a loss, probed back), denied, backup."),
        ("Retransmits by cause", "pps", [
            (f"sum by (cause) (rate(mrc_peer_retransmits_total{SEL}{RATE}))", "{{cause}}")],
         "Packets sent again per second: RACK, RTO, trimmed or other NACK, plane down."),
        ("Congestion window", "bytes", [
            (f"mrc_connection_cwnd_bytes{SEL}", "{{peer}} {{connection}}")],
         "The sender's congestion window of each live connection."),
    ]),
    ("Drops and errors", [
        ("Receiver drops by reason", "pps", [
            (f"sum by (reason) (rate(mrc_peer_drops_total{SEL}{RATE}))", "{{reason}}"),
            (f"sum by (reason) (rate(mrc_endpoint_drops_total{SEL}{RATE}))",
             "endpoint {{reason}}")],
         "Packets dropped per second: by a connection's receiver (duplicates, window, auth, "
         "replay...) or by the endpoint before any connection took them."),
        ("Socket layer incidents", "cps", [
            (f"sum by (kind) (rate(mrc_io_events_total{SEL}{RATE}))", "{{kind}}")],
         "Path socket errors, injected drops and internal errors (any internal error is a bug)."),
        ("Refused connections", "cps", [
            (f"sum by (reason) (rate(mrc_connections_refused_total{SEL}{RATE}))",
             "{{reason}}")],
         "Connection REQUESTs refused per second: unknown peer, security policy, resources."),
    ]),
    ("Service", [
        ("Connections", "none", [
            (f"sum by (kind, role) (mrc_connections{SEL})", "{{kind}} {{role}}")],
         "Live connections: application (app) or mailbox (mail), requester or responder."),
        ("WRITEs completed by status", "ops", [
            (f"sum by (status) (rate(mrc_writes_total{SEL}{RATE}))", "{{status}}")],
         "Application WRITEs completed per second, by completion status."),
        ("Messages by outcome", "ops", [
            (f"sum by (outcome) (rate(mrc_messages_total{SEL}{RATE}))", "{{outcome}}")],
         "Small mailbox messages per second."),
        ("Clients and regions", "none", [
            (f"sum(mrc_clients{SEL})", "control clients"),
            (f"sum(mrc_regions{SEL})", "regions"),
            (f"sum(mrc_regions_unmapping{SEL})", "regions unmapping")],
         "Programs connected to the control socket and the memory they registered."),
        ("Registered memory", "bytes", [
            (f"sum(mrc_region_bytes{SEL})", "registered")],
         "Bytes of application regions the daemon has mapped."),
        ("Control socket", "ops", [
            (f"sum by (event) (rate(mrc_control_total{SEL}{RATE}))", "{{event}}")],
         "Control socket requests, refused clients and errors by code, per second."),
        ("Uptime", "s", [
            (f"max(mrc_uptime_seconds{SEL})", "uptime")],
         "Seconds since the daemon started."),
    ]),
]


def _panel(pid: int, title: str, unit: str, targets: list[tuple[str, str]], desc: str,
           x: int, y: int) -> dict[str, Any]:  # fmt: skip
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit, "min": 0}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
             "datasource": {"type": "prometheus", "uid": "${datasource}"}}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (schema version 39)."""
    panels: list[dict[str, Any]] = []
    y = 0
    pid = 1
    for row_title, row in ROWS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})  # fmt: skip
        pid += 1
        y += 1
        for i, (title, unit, targets, desc) in enumerate(row):
            panels.append(_panel(pid, title, unit, targets, desc, 12 * (i % 2), y + 8 * (i // 2)))
            pid += 1
        y += 8 * ((len(row) + 1) // 2)
    return {
        "uid": UID,
        "title": "mrc daemon",
        "description": "Planes, paths, drops and service of mrc peer daemons (mrc daemon "
        "--metrics).",
        "tags": ["mrc", "rdma", "transport"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-15m", "to": "now"},
        "refresh": "10s",
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0},
            {"name": "instance", "label": "Daemon", "type": "query",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": "label_values(mrc_uptime_seconds, instance)", "refId": "I"},
             "definition": "label_values(mrc_uptime_seconds, instance)",
             "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
             "current": {}, "hide": 0},
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main() -> int:
    OUT.write_text(render())
    sys.stdout.write(f"wrote {OUT}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
