#!/usr/bin/env python3
"""Summarises ONNX Runtime profiles (CONVEYOR_ORT_PROFILE=PREFIX writes one Chrome trace per
session, PREFIX_<model>_<date>.json, when the session closes).

usage: scripts/ort-profile.py TRACE.json[.gz] [TRACE.json[.gz] ...]

For each trace: the runs (model_run) grouped by their token count (the ids the embedding's Gather
takes), with median and p90 wall times and the median of the node times that each run
summed (on CUDA a node's time is the host's time to launch it, so runs whose node times add
up to their wall time are bound by launches, not by the GPU); the operators by total time and
execution provider; every node that ran on the CPU in a session on a device, and the copies
between host and device (Memcpy nodes) per run.
"""
import collections
import gzip
import json
import statistics
import sys


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_tokens(nodes):
    """The run's token count: the first dimension of the ids its first Gather (the
    embedding lookup) takes, else of its first node's first input."""
    def dims(node, i):
        shapes = node.get("args", {}).get("input_type_shape") or []
        if i < len(shapes):
            for d in shapes[i].values():
                return d[0] if d else 1
        return 0
    for n in nodes:
        if n["args"].get("op_name") == "Gather":
            return dims(n, 1)
    return dims(nodes[0], 0)


def summarise(path):
    events = json.load(gzip.open(path) if path.endswith(".gz") else open(path))
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    nodes = sorted((e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")), key=lambda e: e["ts"])
    print(f"## {path}\n")
    print(f"{len(runs)} runs, {len(nodes)} node executions\n")
    # Assign nodes to runs by time.
    per_run = [[] for _ in runs]
    j = 0
    for i, r in enumerate(runs):
        end = r["ts"] + r["dur"]
        while j < len(nodes) and nodes[j]["ts"] < r["ts"]:
            j += 1
        while j < len(nodes) and nodes[j]["ts"] <= end:
            per_run[i].append(nodes[j])
            j += 1
    groups = collections.defaultdict(list)
    for r, ns in zip(runs, per_run):
        if ns:
            groups[run_tokens(ns)].append((r, ns))
    print("| tokens in the run | runs | wall p50 ms | wall p90 ms | node times p50 ms | nodes per run | Memcpy per run |")
    print("|---|---|---|---|---|---|---|")
    few = sum(len(g) for g in groups.values() if len(g) < 3)
    for tokens in sorted(groups):
        g = groups[tokens]
        if len(g) < 3:
            continue
        walls = [r["dur"] / 1e3 for r, _ in g]
        sums = [sum(n["dur"] for n in ns) / 1e3 for _, ns in g]
        memcpy = [sum(1 for n in ns if n["args"].get("op_name", "").startswith("Memcpy")) for _, ns in g]
        print(f"| {tokens} | {len(g)} | {pct(walls, .5):.2f} | {pct(walls, .9):.2f} | {pct(sums, .5):.2f} | "
              f"{statistics.median(len(ns) for _, ns in g):.0f} | {statistics.median(memcpy):.0f} |")
    if few:
        print(f"\n({few} runs of token counts seen fewer than 3 times are left out.)")
    ops = collections.Counter()
    count = collections.Counter()
    for n in nodes:
        k = (n["args"].get("op_name", "?"), n["args"].get("provider", "?"))
        ops[k] += n["dur"]
        count[k] += 1
    total = sum(ops.values()) or 1
    print("\n| operator | provider | executions | total ms | share |")
    print("|---|---|---|---|---|")
    for (op, prov), d in ops.most_common(25):
        print(f"| {op} | {prov} | {count[(op, prov)]} | {d / 1e3:.1f} | {100 * d / total:.1f}% |")
    providers = {n["args"].get("provider") for n in nodes}
    if len(providers - {"CPUExecutionProvider"}) > 0:
        cpu = collections.Counter(n["name"][: -len("_kernel_time")] for n in nodes if n["args"].get("provider") == "CPUExecutionProvider")
        print(f"\nNodes on the CPU in a device session: {len(cpu)}" + ("" if not cpu else ": " + ", ".join(f"{k} ({v})" for k, v in cpu.most_common(20))))
    print()


for p in sys.argv[1:]:
    summarise(p)
