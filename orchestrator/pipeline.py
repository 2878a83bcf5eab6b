"""The whole job behind `jobs/train.py --model MODEL` (and its presets jobs/<model>.py):
profile -> plan every candidate mp_degree -> cross-over projection -> Tune sweep of
global batch x mp_degree -> final training of the winner -> report. Every stage prints
a status line; everything lands in --storage. What can be checked before Ray starts
is checked first (orchestrator/job_args.py)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


from orchestrator.job_args import (
    DEFAULT_PLAN_TIME_LIMIT_S,
    JobArgs,
    JobInputs,
    check_job,
    parse_args,
)
from orchestrator.runtime.device_kind import DeviceKind
from orchestrator.sweep import (
    METRIC,
    SweepJob,
    best_result,
    driver_resources,
    feasible,
    max_concurrent_trials,
    run_sweep,
    set_aside_unrecorded_trials,
    train_config,
)
from orchestrator.sweep_trials import cores_text, probe_text, trial_records
from orchestrator.train.cluster import ray_cluster
from orchestrator.train.resources import (JobDevices, decide_devices, load_node_types,
                                          profile_on_gpu_worker)
from orchestrator.train.trainer import fit
from placement.cluster import ClusterSpec
from placement.errors import UserError
from placement.graph import OpGraph
from placement.io import save_graph
from placement.plan import Plan, load_plan
from placement.policy import plan_mp_degrees
from placement.scaling.crossover import CrossoverResult, crossover
from placement.scaling.efficiency import NoiseScaleModel, StatisticalEfficiency
from placement.scaling.step import BatchRule, worker_step
from placement.scaling.timed_step import TimedStep
from placement.scaling.workers import default_batches, worker_steps
from placement.sweep_space import Candidate, StepModel, scanned_worker_batches, sweep_space

#: Where the job keeps its timed steps (a resumed job ranks with them again).
TIMED_STEPS_FILE = "timed_steps.json"


def status(stage: str, text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {stage}: {text}", flush=True)


def main(model: str | None = None, argv: Sequence[str] | None = None,
         prog: str = "jobs/train.py") -> int:
    try:
        args = parse_args(argv, model, prog)
        inputs = check_job(args)
        with ray_cluster(args.fake_cluster):
            run_job(args, inputs)
    except UserError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    return 0


def mp_candidates(devices_per_node: int, num_gpus: int) -> list[int]:
    """Powers of two that fit on one node and in the job."""
    out, m = [], 1
    while m <= min(devices_per_node, num_gpus):
        out.append(m)
        m *= 2
    return out


def plan_candidates(graph, cluster: ClusterSpec, mp_degrees: Sequence[int],
                    time_limit_s: float = DEFAULT_PLAN_TIME_LIMIT_S) -> dict[int, Plan]:
    """For each mp_degree, the plan (and micro-batch count 1, 2 or 4) of least
    predicted step time, by the planning policy within `time_limit_s` in all."""
    return plan_mp_degrees(graph, cluster, mp_degrees, time_limit_s=time_limit_s)


def micro_batch_phrase(count: int) -> str:
    return f"{count} micro-batch" + ("" if count == 1 else "es")


def plan_status(mp_degree: int, p: Plan) -> str:
    """One status line for a plan: who made it, its value, bound and gap, and why it
    is not the MILP's when it is not."""
    line = (f"mp {mp_degree}: predicted step {p.step_time * 1e3:.1f} ms "
            f"({micro_batch_phrase(p.num_micro_batches)}) by {p.solver}, {p.status}: "
            f"value {p.value * 1e3:.1f} ms, bound {p.lower_bound * 1e3:.1f} ms, "
            f"gap {p.gap:.1%}")
    why = [n for n in p.notes if n.startswith("warning") or "found no plan" in n
           or "budget" in n or "too large" in n or "analytic bound" in n
           or n.startswith("value per micro-batch count")]
    return line + "".join(f"; {n}" for n in why)


def step_models(graph, plans: dict[int, Plan], cluster: ClusterSpec,
                rule: BatchRule) -> dict[int, StepModel]:
    """The scaling model's worker step of each plan, at any per-worker batch."""
    return {m: (lambda batch, p=p: worker_step(graph, p, cluster, batch, rule))
            for m, p in plans.items()}


def candidates_for(graph, plans: dict[int, Plan], cluster: ClusterSpec, base_batch: int,
                   num_gpus: int, efficiency: StatisticalEfficiency,
                   dataset_size: float, rule: BatchRule, base_lr: float,
                   timed: dict[int, TimedStep] | None = None) -> list[Candidate]:
    """The sweep space of the job's plans (placement/sweep_space.py), predicted by the
    timed steps where there are some."""
    return sweep_space(step_models(graph, plans, cluster, rule), cluster,
                       base_batch=base_batch, num_gpus=num_gpus, efficiency=efficiency,
                       dataset_size=dataset_size, base_lr=base_lr, timed=timed)


def batch_rule(args: JobArgs, base_batch: int, measured_here: bool) -> BatchRule:
    """How op times scale with the batch: measured here where the graph was timed here;
    linear (the rule's default) for a graph timed on a GPU worker."""
    if not measured_here:
        return BatchRule(profiled_batch=float(base_batch))
    from orchestrator.profile.batch_scaling import LARGER_BATCH_MULTIPLE, fixed_fraction

    f = fixed_fraction(args.model, args.preset, base_batch)
    status("3/6 cross-over", f"{f:.0%} of a step at batch {base_batch} does not grow with "
                             f"the batch (steps timed at {base_batch} and "
                             f"{base_batch * LARGER_BATCH_MULTIPLE})")
    return BatchRule(profiled_batch=float(base_batch), fixed_fraction=f)


def trial_status(t: dict) -> str:
    """One status line per trial: the prediction it was ranked by against its measure."""
    own = t["timed_here_step_s"]
    timed_here = None if own is None else f"timed in its workers at {own * 1e3:.1f} ms"
    measure = "; ".join(filter(None, (f"{t['error']:+.0%}", cores_text(t), timed_here,
                                      probe_text(t))))
    return (f"{t['key']}: ranked by {t['predicted_step_s'] * 1e3:.1f} ms a step "
            f"({t['step_source']} {t['model_step_s'] * 1e3:.1f} ms "
            f"{t['overhead_s'] * 1e3:+.1f} ms, from "
            f"{t['correction_from']}), measured {t['measured_step_s'] * 1e3:.1f} ms "
            f"({measure})")


@dataclass(frozen=True, kw_only=True)
class SweepOutcome:
    winner: Candidate
    projected_time_s: float
    """The winner's projected time to accuracy, as its trial reported it."""
    pruned: list[str]
    """Why each candidate the cluster cannot hold was left out."""
    trials: list[dict]
    """Every trial's record: the prediction that ranked it against its measure
    (orchestrator/sweep_trials.py)."""


def run_job(args: JobArgs, inputs: JobInputs) -> dict:
    args.storage.mkdir(parents=True, exist_ok=True)
    # On an autoscaling cluster the GPU nodes exist once asked for (train/resources.py).
    devices = decide_devices(args.num_gpus, fake_cluster=args.fake_cluster is not None,
                             cluster_name=args.cluster, types=load_node_types(),
                             say=lambda text: status("0/6 devices", text))
    graph = profile_stage(args, inputs.base_batch, devices)
    plans = plan_stage(args, graph, devices)
    efficiency = inputs.efficiency or calibrate(args, inputs, devices.kind)
    rule = batch_rule(args, inputs.base_batch, devices.kind.measured_here)
    result = crossover_stage(args, inputs, graph, plans, devices, efficiency, rule)
    timed = timing_stage(args, inputs, graph, plans, devices, efficiency, rule)
    sweep = sweep_stage(args, inputs, graph, plans, devices, efficiency, rule, timed)
    final = train_stage(args, sweep.winner, plans, devices)
    summary = {
        "model": args.model, "preset": args.preset, "cluster": devices.cluster.name,
        "num_gpus": devices.num_gpus, "base_batch": inputs.base_batch,
        "statistical_efficiency": efficiency.source, "dataset_size": inputs.dataset_size,
        "winner": sweep.winner.to_dict(),
        "winner_projected_time_s": sweep.projected_time_s,
        "crossover_num_gpus": result.crossover_num_gpus,
        "final": {"losses": final["losses"], "step_times_s": final["step_times_s"],
                  "workers": final["workers"]},
        "pruned": sweep.pruned,
        "hybrid": dataclasses.asdict(sweep.winner.config),
        "step_prediction": sweep.winner.step_source,
        "timed_steps": None if timed is None else [t.to_dict() for t in timed.values()],
        "trials": sweep.trials,
    }
    report_stage(args, plans, result, summary)
    return summary


def profile_stage(args: JobArgs, base_batch: int, devices: JobDevices) -> OpGraph:
    """The model's graph at the preset's batch, costed for the job's devices: measured
    here where they are CPU threads, else on one of the cluster's GPUs."""
    from orchestrator.profile import profile_model, profile_notes

    cluster, measured_here = devices.cluster, devices.kind.measured_here
    status("1/6 profile", f"{args.model} ({args.preset}), batch {base_batch}, "
                          f"costs for {cluster.device.name}"
                          + ("" if measured_here else ", timed on a GPU worker"))
    graph = (profile_model(args.model, preset=args.preset, batch=base_batch, target="cpu",
                           granularity=args.granularity)
             if measured_here else
             profile_on_gpu_worker(args.model, preset_name=args.preset, batch=base_batch,
                                   target=cluster.device.name, granularity=args.granularity))
    for note in profile_notes(graph):
        status("1/6 profile", f"note: {note}")
    save_graph(graph, args.storage / "graph.json")
    return graph


def plan_stage(args: JobArgs, graph: OpGraph, devices: JobDevices) -> dict[int, Plan]:
    """A plan for every mp_degree that fits on a node, saved under plans/. A resumed
    job keeps the plans its sweep was ranked with: a plan made again on a loaded host
    may differ (another placement, another micro-batch count), and the trials still to
    run carry the first run's candidates."""
    cluster = devices.cluster
    mps = mp_candidates(cluster.devices_per_node, devices.num_gpus)
    plans_dir = args.storage / "plans"
    saved = {m: plans_dir / f"plan_mp{m}.json" for m in mps}
    if args.resume and all(path.exists() for path in saved.values()):
        status("2/6 plan", f"--resume: the sweep's plans for mp_degree {mps}, from {plans_dir}")
        return {m: load_plan(path) for m, path in saved.items()}
    status("2/6 plan", f"mp_degree {mps} on {cluster.name}, within "
                       f"{args.plan_time_limit_s:g} s")
    plans = plan_candidates(graph, cluster, mps, args.plan_time_limit_s)
    plans_dir.mkdir(exist_ok=True)
    for m, p in plans.items():
        p.save(plans_dir / f"plan_mp{m}.json")
        status("2/6 plan", plan_status(m, p))
    return plans


def crossover_stage(args: JobArgs, inputs: JobInputs, graph: OpGraph,
                    plans: dict[int, Plan], devices: JobDevices,
                    efficiency: StatisticalEfficiency, rule: BatchRule) -> CrossoverResult:
    """DP-only vs hybrid time to accuracy from 1 to 4096 devices, saved as
    crossover.json."""
    status("3/6 cross-over", f"DP vs hybrid time to accuracy, 1 to 4096 devices; "
                             f"{efficiency.source}, {inputs.dataset_size:,.0f} samples an epoch")
    result = crossover(worker_steps(graph, plans, devices.cluster,
                                    default_batches(inputs.base_batch), rule),
                       devices.cluster, efficiency, inputs.dataset_size, 4096)
    (args.storage / "crossover.json").write_text(json.dumps(result.to_dict(), indent=1))
    return result


def timed_status(t: TimedStep) -> str:
    """One status line per timed mp_degree: its step (allreduce included) per batch."""
    steps = ", ".join(f"{t.step_s(b) * 1e3:.1f} ms at {b:g}" for b in t.batches)
    return (f"mp {t.mp_degree} x dp {t.dp_degree} ({micro_batch_phrase(t.num_micro_batches)}), "
            f"timed step per worker batch: {steps} (medians of {t.rounds})")


def saved_timed_steps(path: Path) -> dict[int, TimedStep] | None:
    """The timed steps a job saved, by mp_degree; None if an older version wrote them
    (before a dp > 1 step was timed side by side, they held no allreduce)."""
    try:
        return {t["mp_degree"]: TimedStep.from_dict(t) for t in json.loads(path.read_text())}
    except (KeyError, TypeError):
        return None


def timing_stage(args: JobArgs, inputs: JobInputs, graph: OpGraph, plans: dict[int, Plan],
                 devices: JobDevices, efficiency: StatisticalEfficiency,
                 rule: BatchRule) -> dict[int, TimedStep] | None:
    """Each mp_degree's worker step timed here, its dp workers side by side, at every
    worker batch the sweep may run, where the devices are this host's CPU threads; None
    on GPUs, whose trials the scaling model ranks."""
    if not devices.kind.measured_here:
        return None
    saved = args.storage / TIMED_STEPS_FILE
    if args.resume and saved.exists():
        # The sweep's candidates were ranked by these; the trials still to run keep them.
        kept = saved_timed_steps(saved)
        if kept is not None:
            status("4/6 sweep", f"--resume: the sweep's timed steps, from {saved}")
            return kept
        status("4/6 sweep", f"--resume: {saved} is of an older version (a dp > 1 step "
                            "timed in one process), timing the steps again")
    from orchestrator.train.step_timing import time_worker_steps

    batches = scanned_worker_batches(step_models(graph, plans, devices.cluster, rule),
                                     devices.cluster, base_batch=inputs.base_batch,
                                     num_gpus=devices.num_gpus, efficiency=efficiency,
                                     dataset_size=inputs.dataset_size)
    dp_degrees = {m: devices.num_gpus // m for m in batches}
    status("4/6 sweep", f"timing each mp_degree's executor step here, its dp workers side by "
                        f"side ({dp_degrees}), at the worker batches "
                        f"{ {m: [int(b) for b in bs] for m, bs in batches.items()} }")
    timed = time_worker_steps(args.model, args.preset, plans, batches, dp_degrees)
    saved.write_text(json.dumps([t.to_dict() for t in timed.values()], indent=1) + "\n")
    for t in timed.values():
        status("4/6 sweep", timed_status(t))
    return timed


def sweep_stage(args: JobArgs, inputs: JobInputs, graph: OpGraph, plans: dict[int, Plan],
                devices: JobDevices, efficiency: StatisticalEfficiency,
                rule: BatchRule, timed: dict[int, TimedStep] | None) -> SweepOutcome:
    """The Tune sweep of the candidates the cluster holds, and its best trial."""
    nodes, kind = devices.nodes, devices.kind
    candidates = candidates_for(graph, plans, devices.cluster, inputs.base_batch,
                                devices.num_gpus, efficiency, inputs.dataset_size, rule,
                                inputs.base_lr, timed)
    kept, pruned = feasible(candidates, nodes, model=args.model, preset=args.preset,
                            device_kind=kind)
    for reason in pruned:
        status("4/6 sweep", f"pruned {reason}")
    if not kept:
        raise UserError("no configuration of the sweep fits this cluster: " + "; ".join(pruned))
    concurrent = max_concurrent_trials(kept, nodes, kind)
    driver = driver_resources(nodes, 0 if kind.ray_gpus else max(
        c.dp_degree * c.mp_degree for c in kept))
    status("4/6 sweep", f"{min(args.max_trials, len(kept))} trial(s) of {args.trial_steps} "
                        f"steps, {concurrent} at a time, every mp_degree first, then by "
                        f"corrected prediction ({kept[0].step_source}), out of "
                        f"{[c.key() for c in kept]}")
    job = SweepJob(model=args.model, preset=args.preset, steps=args.trial_steps,
                   data=args.data, device_kind=kind, plans=plans, efficiency=efficiency,
                   dataset_size=inputs.dataset_size, storage=str(args.storage.resolve()),
                   time_batches={m: t.batches for m, t in (timed or {}).items()})
    grid = run_sweep(kept, job, max_trials=args.max_trials, max_concurrent=concurrent,
                     time_budget_s=args.time_budget_s, resume=args.resume, driver=driver)
    if args.resume:
        for folder in set_aside_unrecorded_trials(Path(grid.experiment_path),
                                                  {r.path for r in grid if r.path}):
            status("4/6 sweep", f"moved {folder.name}, a trial the interrupted sweep never "
                                f"recorded (run again as another trial), to {folder.parent}")
    best = best_result(list(grid), grid.experiment_path)
    winner = Candidate.from_dict(best.config["candidate"])
    trials = trial_records(grid)
    for t in trials:
        status("4/6 sweep", trial_status(t))
    status("4/6 sweep", f"best {winner.key()}: projected {best.metrics[METRIC]:.4g} s to "
                        f"target")
    return SweepOutcome(winner=winner, projected_time_s=best.metrics[METRIC],
                        pruned=pruned, trials=trials)


def train_stage(args: JobArgs, winner: Candidate, plans: dict[int, Plan],
                devices: JobDevices) -> dict:
    """The winner trained for --final-steps, checkpointed halfway and at the end."""
    status("5/6 train", f"{winner.key()} (dp {winner.dp_degree} x mp {winner.mp_degree}) "
                        f"for {args.final_steps} steps")
    final_cfg = dataclasses.replace(
        train_config(winner, model=args.model, preset=args.preset, steps=args.final_steps,
                     device_kind=devices.kind, data=args.data),
        checkpoint_every=max(1, args.final_steps // 2))
    return fit(final_cfg, plans[winner.mp_degree], storage=args.storage, name="final",
               max_failures=1)


def report_stage(args: JobArgs, plans: dict[int, Plan], result: CrossoverResult,
                 summary: dict) -> None:
    """winner.json and the HTML report of plots."""
    from orchestrator.report.html import write_report

    (args.storage / "winner.json").write_text(json.dumps(summary, indent=1) + "\n")
    status("6/6 report", "writing plots and the HTML page")
    page = write_report(args.storage, plans=plans, crossover=result, summary=summary)
    status("done", f"report {page}; TensorBoard: tensorboard --logdir {args.storage / 'sweep'}")


def calibrate(args: JobArgs, inputs: JobInputs, kind: DeviceKind) -> NoiseScaleModel:
    """The efficiency of a model without figures of its own: McCandlish's model with the
    gradient noise scale measured in a short training run on one device."""
    from orchestrator.train.calibrate import noise_scale_on_cluster

    batch = inputs.base_batch
    status("3/6 cross-over", f"no statistical-efficiency figures for {args.model}: measuring "
                             f"its gradient noise scale over {args.calibration_steps} steps "
                             f"of batch {batch}")
    b_noise = noise_scale_on_cluster(args.model, args.preset, global_batch=batch,
                                     steps=args.calibration_steps, lr=inputs.base_lr,
                                     data=args.data, kind=kind)
    return NoiseScaleModel(b_noise=b_noise, min_epochs=args.min_epochs or 1.0,
                           source=f"noise scale B_noise={b_noise:.4g} (measured in "
                                  f"{args.calibration_steps} calibration steps of batch "
                                  f"{batch})")
