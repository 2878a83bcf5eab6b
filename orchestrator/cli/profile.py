"""`orchestrator profile`: trace a model into a costed op graph and save it as JSON."""

from __future__ import annotations

import argparse

from orchestrator.profile.api import (DEVICES, TARGETS, profile_model, profile_notes,
                                      single_device_step_s)
from orchestrator.profile.capture import GRANULARITIES
from orchestrator.cli.paths import output_file
from placement.cluster import PRECISIONS
from placement.graph import OpGraph
from placement.io import save_graph


CAPTURE_NAMES = {"fx": "torch.fx", "export": "torch.export"}


def per_micro_batches(ratios) -> str:
    """A profiled ratio for the summary: 'x1.10 at K=1, x1.80 at K=4' per micro-batch
    count, or one 'x1.10' (a graph profiled before the ratios were per count)."""
    if not isinstance(ratios, dict):
        return f"x{ratios:.2f}"
    return ", ".join(f"x{r:.2f} at K={k}" for k, r in sorted(ratios.items(),
                                                              key=lambda kv: int(kv[0])))


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="trace and cost a model into an op graph",
                       description=__doc__)
    p.add_argument("--model", required=True,
                   help="biglstm, gnmt, inception_v3, vgg16, or MODULE:FUNCTION")
    p.add_argument("--preset", default="tiny",
                   help="tiny (measured on this CPU) or paper (meta device, projected)")
    p.add_argument("--batch", type=int, default=None, help="samples per step "
                   "(default: the preset's)")
    p.add_argument("--seq-chunk", type=int, default=None, dest="seq_chunk",
                   help="time steps per op of a recurrent model (default: the preset's)")
    p.add_argument("--target", default=None,
                   help=f"device kind to report: {', '.join(TARGETS)} (default: the "
                        "kind --device measures, cpu for meta)")
    p.add_argument("--device", default=None, choices=DEVICES,
                   help="where ops are timed: cuda (CUDA events after warm-up, on this "
                        "machine's GPU), cpu (one thread), or meta (nothing timed, all "
                        "projected); default: cuda where this machine has a GPU (where "
                        "a job on it trains), else cpu for tiny and meta for paper")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="matmul precision of the projected GPU times (default: fp32)")
    p.add_argument("--granularity", default="module",
                   help=f"what one op is: {', '.join(GRANULARITIES)} (module: a layer or "
                   "function, cheap elementwise work fused in; aten: one ATen operator as "
                   "the model calls it, captured with torch.export, no fusion; core-aten: "
                   "one operator of PyTorch's Core ATen set; decomposed: Core ATen with batch "
                   "and layer norm decomposed into their arithmetic; default: module)")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per op (median)")
    p.add_argument("--out", required=True, type=output_file, help="write the op graph JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    graph = profile_model(args.model, preset=args.preset, batch=args.batch,
                          seq_chunk=args.seq_chunk, target=args.target, device=args.device,
                          precision=args.precision, repeats=args.repeats,
                          progress=not args.quiet, granularity=args.granularity)
    save_graph(graph, args.out)
    print(summary(graph, graph.metadata["target"]))
    print(f"  wrote {args.out}")
    return 0


def summary(graph: OpGraph, target: str) -> str:
    md = graph.metadata
    step_s = single_device_step_s(graph, target)
    flops = md["forward_flops"] + md["backward_flops"]
    frozen = sum(op.frozen_bytes for op in graph.ops)
    kinds: dict[str, int] = {}
    for op in graph.ops:
        kind = str(op.attrs["layer_kind"])
        kinds[kind] = kinds.get(kind, 0) + 1
    source = md["cpu_times"] if target == "cpu" else md["gpu_times"]
    return "\n".join([
        f"{graph.name}: {len(graph.ops)} ops ({md['granularity']} granularity, captured "
        f"with {CAPTURE_NAMES[md['capture']]} in {md['capture_seconds']:.2f} s), "
        f"{len(graph.edges)} edges, batch {md['batch']}"
        + (f", {md['seq_chunk']} time steps per op" if md.get("seq_chunk") else ""),
        "  ops by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())),
        f"  parameters {md['param_bytes'] / 4:,.0f} ({md['param_bytes'] / 2**20:,.1f} MiB"
        f"{f', {frozen / 2**20:,.1f} MiB frozen' if frozen else ''})"
        f"   step peak memory {md['step_peak_bytes'] / 2**20:,.1f} MiB",
        f"  FLOPs per step {flops:.4g} (forward {md['forward_flops']:.4g})",
        f"  predicted single-device step time on {target}: {step_s * 1e3:.4g} ms "
        f"({source}), {md['batch'] / step_s:,.1f} samples/s",
        *([f"  split plans: {per_micro_batches(md['split_overhead'][target])} per task "
           "(one autograd call per op and micro-batch, measured)"]
          if target in md.get("split_overhead", {}) else []),
        *([f"  devices side by side: {per_micro_batches(md['corun_slowdown'][target])} "
           "while two run at once (threads of one host, measured)"]
          if target in md.get("corun_slowdown", {}) else []),
        f"  profiled in {md['profile_seconds']:.1f} s",
        *(f"  note: {note}" for note in profile_notes(graph)),
    ])
