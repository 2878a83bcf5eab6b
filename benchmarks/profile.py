"""Profiler fidelity, speed and GPU projection.

    python -m benchmarks profile [--trials 3] [--skip-paper]

1. Fidelity: for each `tiny` model, the simulated single-device step time of its profiled
   graph (`placement.planner.plan` on one device of the `cpu` preset) against the measured
   whole forward+backward step of the model (median of 7 steps just before and 7 just
   after profiling, averaged), both on one CPU thread; medians over trials (the machine
   is shared and noisy).
2. Speed: seconds to profile each `tiny` model (measured) and each `paper` model (meta).
3. Projection: single-device training throughput of the `paper` models from the
   roofline, next to published figures.
"""

from __future__ import annotations

import argparse
import os
import statistics

from orchestrator.models import MODEL_NAMES, biglstm, gnmt
from orchestrator.profile.api import measure_step_s, profile_model, single_device_step_s
from placement.cluster import DeviceKind, preset
from placement.planner import PlanConfig, plan

# NVIDIA Tesla P100 SXM2 datasheet: 10.6 TFLOP/s fp32, 732 GB/s HBM2. The one published
# Inception-V3 training rate we could verify offline is on a P100.
P100 = DeviceKind(name="p100", memory_bytes=16 * 2**30, peak_flops=10.6e12,
                  peak_tensor_flops=10.6e12, memory_bandwidth_bytes_per_s=732e9)

_GNMT = gnmt.PRESETS["paper"]
#: model -> (unit, units per sample, published rate or None, device kind, source).
PUBLISHED = {
    "gnmt": ("tokens/s", _GNMT.src_len + _GNMT.tgt_len, 21_346, "v100",
             "NVIDIA DeepLearningExamples PyTorch/Translation/GNMT README: DGX-1, 1x V100 "
             "16G, FP32, batch 128, pytorch-19.01 (source + target tokens)"),
    "inception_v3": ("images/s", 1, 142, "p100",
                     "TensorFlow benchmarks page (2017): DGX-1, 1x P100, batch 64, "
                     "synthetic data"),
    "biglstm": ("words/s", biglstm.PRESETS["paper"].num_steps, None, "v100",
                "no per-GPU rate verified offline (Jozefowicz et al. 2016 report 32 K40s "
                "for 3 weeks, no rate)"),
    "vgg16": ("images/s", 1, None, "v100", "no V100/P100 FP32 rate verified offline"),
}


def fidelity(trials: int) -> list[dict]:
    rows = []
    for name in MODEL_NAMES:
        sims, measured, ratios, seconds = [], [], [], []
        for _ in range(trials):
            # Measure the model's own step just before and just after profiling, so
            # both see the same load on this shared machine.
            before = measure_step_s(name, preset="tiny", repeats=7, warmup=2)
            graph = profile_model(name, preset="tiny", repeats=7, warmup=2)
            after = measure_step_s(name, preset="tiny", repeats=7, warmup=2)
            sim = plan(graph, preset("cpu"), PlanConfig(num_devices=1)).step_time
            real = (before + after) / 2
            sims.append(sim)
            measured.append(real)
            ratios.append(sim / real)
            seconds.append(graph.metadata["profile_seconds"])
        rows.append({"model": name, "ops": len(graph.ops),
                     "simulated_ms": 1e3 * statistics.median(sims),
                     "measured_ms": 1e3 * statistics.median(measured),
                     "ratio": statistics.median(ratios),
                     "low": min(ratios), "high": max(ratios),
                     "profile_s": statistics.median(seconds)})
    return rows


def projection() -> list[dict]:
    rows = []
    for name in MODEL_NAMES:
        graph = profile_model(name, preset="paper", extra_kinds=(P100,))
        md = graph.metadata
        unit, per_sample, published, kind, source = PUBLISHED[name]
        # On one device nothing overlaps: plan()'s step time is the sum of op times.
        v100_step = plan(graph, preset("dgx1-v100"), PlanConfig(num_devices=1)).step_time
        step = single_device_step_s(graph, kind)
        rows.append({"model": name, "ops": len(graph.ops),
                     "profile_s": md["profile_seconds"], "param_bytes": md["param_bytes"],
                     "peak_bytes": md["step_peak_bytes"],
                     "flops": md["forward_flops"] + md["backward_flops"],
                     "batch": md["batch"], "v100_ms": 1e3 * v100_step,
                     "v100_rate": md["batch"] * per_sample / v100_step,
                     "kind": kind, "rate": md["batch"] * per_sample / step, "unit": unit,
                     "published": published, "source": source})
    return rows


def report(fid: list[dict], proj: list[dict]) -> str:
    lines = [f"machine: {os.cpu_count()} shared cores; one torch thread per measurement",
             "", "| model (tiny) | ops | simulated step | measured step | ratio (min-max) "
             "| profiling |", "|---|---|---|---|---|---|"]
    for r in fid:
        lines.append(f"| {r['model']} | {r['ops']} | {r['simulated_ms']:.2f} ms | "
                     f"{r['measured_ms']:.2f} ms | {r['ratio']:.3f} ({r['low']:.2f}-"
                     f"{r['high']:.2f}) | {r['profile_s']:.1f} s |")
    if proj:
        lines += ["", "| model (paper, meta) | ops | profiling | params | step peak | "
                  "FLOPs/step | batch | V100 step | V100 rate | published (device) | "
                  "projected on that device | ratio |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in proj:
            pub = (f"{r['published']:,} {r['unit']} ({r['kind']})" if r["published"]
                   else "n/a")
            ours = f"{r['rate']:,.0f}" if r["published"] else "n/a"
            ratio = f"{r['rate'] / r['published']:.2f}" if r["published"] else "n/a"
            lines.append(
                f"| {r['model']} | {r['ops']} | {r['profile_s']:.1f} s | "
                f"{r['param_bytes'] / 2**30:.2f} GiB | {r['peak_bytes'] / 2**30:.2f} GiB | "
                f"{r['flops']:.3g} | {r['batch']} | {r['v100_ms']:.0f} ms | "
                f"{r['v100_rate']:,.0f} {r['unit']} | {pub} | {ours} | {ratio} |")
        lines += [""] + [f"- {r['model']}: {r['source']}" for r in proj]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks profile")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--skip-paper", action="store_true")
    args = parser.parse_args(argv)
    fid = fidelity(args.trials)
    proj = [] if args.skip_paper else projection()
    print(report(fid, proj))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
