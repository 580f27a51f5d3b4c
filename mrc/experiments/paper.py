"""`python -m mrc.experiments.paper`: the MRC paper's experiments in the simulator, MRC beside
RoCE.

What it holds: the command line (scale presets and knobs: hosts, planes, tier-1 count, link
rate, flow size), the process pool that runs every (experiment, protocol) pair on its own
(`-j`), the side-by-side table with the paper's outcome and whether it holds, `-J` for one
JSON document, and `--plot DIR` for one PNG per experiment when matplotlib is installed.

What it leaves to others: the runs (paper_run.py), the experiments (paper_experiments.py) and
the verdicts (paper_verdict.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from typing import Any

from .paper_experiments import EXPERIMENTS, REFERENCE, VICTIM_ALONE, run_one
from .paper_run import PROTOCOLS, MiB, Scale
from .paper_verdict import CLAIMS, Results, Verdict, needs, verdict

#: Presets: `small` finishes in about a minute on two cores; `paper` is the paper's fabric
#: shape (1,024 hosts × 8 planes, 32 racks, full bisection) with 2 MiB per flow, as in htsim's
#: 1,024-host permutation (about half an hour with -j 2 on this machine's shared cores).
SCALES: dict[str, Scale] = {
    "small": Scale(hosts=32, planes=4, tier1=8, hosts_per_rack=8, flow_bytes=2 * MiB),
    "paper": Scale(hosts=1024, planes=8, tier1=32, hosts_per_rack=32, flow_bytes=2 * MiB),
}


def _job(name: str, proto: str, scale: Scale) -> dict[str, Any]:
    """One pool task: the experiment's metrics and its wall time."""
    t0 = time.perf_counter()
    m = run_one(name, proto, scale)
    m["wall"] = round(time.perf_counter() - t0, 3)
    return m


def run_all(
    names: list[str], scale: Scale, jobs: int, *, progress: bool = False
) -> tuple[Results, list[Verdict]]:
    """Every run `names` need (their references too), `jobs` at a time; then the verdicts.
    With `progress`, a line on stderr as each run ends."""
    wanted: list[str] = []
    for n in names:
        for dep in [*needs(n), n]:
            if dep not in wanted:
                wanted.append(dep)
    tasks = [(n, p) for n in wanted for p in PROTOCOLS]
    results: Results = {n: {} for n in wanted}
    def done(n: str, p: str, m: dict[str, Any]) -> None:
        results[n][p] = m
        if progress:
            count = sum(len(r) for r in results.values())
            print(f"paper: {n} {p} done in {m['wall']:.1f} s ({count} of {len(tasks)})",
                  file=sys.stderr, flush=True)  # fmt: skip

    if jobs <= 1:
        for n, p in tasks:
            done(n, p, _job(n, p, scale))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(_job, n, p, scale): (n, p) for n, p in tasks}
            for fut in as_completed(futures):
                done(*futures[fut], fut.result())
    return results, [verdict(n, results) for n in names]


def _table(scale: Scale, verdicts: list[Verdict], results: Results, wall: float) -> str:
    lines = [
        f"MRC paper experiments: {scale.hosts} hosts x {scale.planes} planes, "
        f"{scale.racks} racks, {scale.tier1} tier-1 per plane, {scale.rate / 1e9:g} Gbit/s "
        f"links, {scale.flow_bytes / MiB:g} MiB flows, seed {scale.seed}",
        f"{'experiment':<12}{'paper outcome':<44}{'MRC':>7}{'RoCE':>7}{'done M':>8}"
        f"{'done R':>8}{'holds':>6}{'wall s M/R':>12}",
    ]
    for v in verdicts:
        lines.append(
            f"{v.experiment:<12}{v.claim:<44}{v.mrc:>7.2f}{v.roce:>7.2f}{v.mrc_done:>8}"
            f"{v.roce_done:>8}{'yes' if v.holds else 'NO':>6}"
            f"{v.wall['mrc']:>6.1f}/{v.wall['roce']:<5.1f}"
        )
    lines.append("")
    for v in verdicts:
        lines.append(f"{v.experiment}: {v.measure}: {v.why}")
    for ref in (REFERENCE, VICTIM_ALONE):
        if ref in results:
            r = results[ref]
            lines.append(
                f"{ref}: aggregate MRC {r['mrc']['aggregate_bps'] / 1e9:.1f}, RoCE "
                f"{r['roce']['aggregate_bps'] / 1e9:.1f} Gbit/s (wall {r['mrc']['wall']:.1f}"
                f"/{r['roce']['wall']:.1f} s)"
            )
    lines.append(f"{sum(v.holds for v in verdicts)} of {len(verdicts)} outcomes hold; "
                 f"{wall:.1f} s wall")  # fmt: skip
    return "\n".join(lines)


#: Samples averaged per plotted point (a sample is 1/40 of a flow's ideal duration).
PLOT_SMOOTH = 6


def _smooth(points: list[tuple[float, float]], n: int) -> tuple[list[float], list[float]]:
    """A trailing mean over `n` samples: per-sample goodput moves in whole messages."""
    xs, ys = [], []
    for i in range(len(points)):
        window = points[max(0, i - n + 1) : i + 1]
        xs.append(points[i][0])
        ys.append(sum(y for _, y in window) / len(window))
    return xs, ys


def _plot(outdir: str, verdicts: list[Verdict], results: Results) -> list[str]:
    """One PNG per experiment: the measured throughput over time, MRC and RoCE."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("paper: --plot needs matplotlib: pip install 'mrc[plot]'", file=sys.stderr)
        return []
    os.makedirs(outdir, exist_ok=True)
    written = []
    for v in verdicts:
        fig, ax = plt.subplots(figsize=(7, 3.2))
        for proto, colour in (("roce", "#d62728"), ("mrc", "#1f77b4")):  # MRC drawn on top
            m = results[v.experiment][proto]
            col = 1 if len(m["affected"]) == m["flows"] else 2
            xs, ys = _smooth([(p[0], p[col]) for p in m["series"]], PLOT_SMOOTH)
            figure = v.mrc if proto == "mrc" else v.roce
            ax.plot([x * 1e3 for x in xs], [y / 1e9 for y in ys], color=colour,
                    label=f"{proto.upper()} ({figure:.2f})")  # fmt: skip
            if "fault_at" in m and proto == "mrc":
                ax.axvline(m["fault_at"] * 1e3, color="grey", linestyle=":", label="fault")
        # RoCE may crawl on long after MRC is done; the comparison is in the first part.
        mrc_end = results[v.experiment]["mrc"]["makespan"]
        ax.set_xlim(0, 2.5 * mrc_end * 1e3)
        ax.set_xlabel("simulated time (ms)")
        ax.set_ylabel("goodput (Gbit/s)")
        ax.set_title(f"{v.experiment}: {v.claim} ({'holds' if v.holds else 'does not hold'})")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(outdir, f"{v.experiment}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _scale(args: argparse.Namespace) -> Scale:
    base = SCALES[args.scale]
    over: dict[str, Any] = {}
    for key in ("hosts", "planes", "tier1", "hosts_per_rack", "seed"):
        if getattr(args, key) is not None:
            over[key] = getattr(args, key)
    if args.rate is not None:
        over["rate"] = args.rate * 1e9
    if args.flow is not None:
        over["flow_bytes"] = int(args.flow * MiB)
    if "hosts_per_rack" not in over and "hosts" in over:
        over["hosts_per_rack"] = min(base.hosts_per_rack, over["hosts"] // 2)
    if "tier1" not in over and ("hosts" in over or "hosts_per_rack" in over):
        over["tier1"] = over.get("hosts_per_rack", base.hosts_per_rack)
    return replace(base, **over).validate()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mrc.experiments.paper",
        description="Run the MRC paper's experiments for MRC and a RoCE-like baseline "
        "(go-back-N, DCQCN, one path per QP) and say whether each outcome holds.",
    )
    ap.add_argument("--scale", choices=sorted(SCALES), default="small",
                    help="preset: small (32 hosts x 4 planes) or paper (1024 x 8)")  # fmt: skip
    ap.add_argument("--hosts", type=int, help="hosts (a multiple of --hosts-per-rack)")
    ap.add_argument("--planes", type=int, help="planes (NIC links per host)")
    ap.add_argument("--tier1", type=int, help="tier-1 switches per plane (default: per rack)")
    ap.add_argument("--hosts-per-rack", dest="hosts_per_rack", type=int)
    ap.add_argument("--rate", type=float, help="link rate, Gbit/s (one plane of a NIC)")
    ap.add_argument("--flow", type=float, help="MiB per flow")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--only", help=f"comma-separated experiments ({', '.join(CLAIMS)})")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                    help="runs at once (processes)")  # fmt: skip
    ap.add_argument("-J", "--json", action="store_true", help="one JSON document")
    ap.add_argument("--json-file", metavar="FILE", help="also write the JSON document to FILE")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    ap.add_argument("--plot", metavar="DIR", help="write one PNG per experiment into DIR")
    args = ap.parse_args(argv)
    try:
        scale = _scale(args)
    except (ValueError, TypeError) as e:
        print(f"paper: {e}", file=sys.stderr)
        return 2
    names = list(CLAIMS) if not args.only else [n.strip() for n in args.only.split(",")]
    for n in names:
        if n not in CLAIMS or n not in EXPERIMENTS:
            print(f"paper: unknown experiment {n!r} (one of {', '.join(CLAIMS)})",
                  file=sys.stderr)  # fmt: skip
            return 2
    if args.jobs < 1:
        print("paper: -j needs at least 1", file=sys.stderr)
        return 2
    out = None
    if args.json_file:
        try:  # before the runs, so a bad path costs nothing
            out = open(args.json_file, "w")  # noqa: SIM115 (closed after the runs)
        except OSError as e:
            print(f"paper: cannot write {args.json_file}: {e.strerror}", file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    results, verdicts = run_all(names, scale, args.jobs, progress=not args.quiet)
    wall = time.perf_counter() - t0
    if args.plot:
        for path in _plot(args.plot, verdicts, results):
            print(f"paper: wrote {path}", file=sys.stderr)
    runs = {n: {p: {k: v for k, v in m.items() if k != "series"} for p, m in r.items()}
            for n, r in results.items()}  # fmt: skip
    doc = {"scale": asdict(scale), "wall": round(wall, 3),
           "verdicts": [v.as_dict() for v in verdicts], "runs": runs}  # fmt: skip
    if out is not None:
        with out:
            json.dump(doc, out, indent=1, default=str)
    if args.json:
        json.dump(doc, sys.stdout, indent=1, default=str)
        print()
    else:
        print(_table(scale, verdicts, results, wall))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
