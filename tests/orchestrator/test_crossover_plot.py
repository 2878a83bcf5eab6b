"""The cross-over chart says what the projection and the sweep's measurements each show."""

from placement.scaling.crossover import CrossoverResult
from orchestrator.report.crossover_plot import save_crossover_plot, verdict

# The demo's sweep (docs/benchmarks.md "Sweep"): the projection never has hybrid win, the
# trials measured dp 1 x mp 2 fastest at 2 devices.
TRIALS = [{"dp_degree": 1, "mp_degree": 2, "projected_time_s": 15384.8},
          {"dp_degree": 2, "mp_degree": 1, "projected_time_s": 26535.4},
          {"dp_degree": 1, "mp_degree": 2, "projected_time_s": 17059.1}]


def test_the_verdict_names_the_measured_winner_beside_the_projection():
    never = CrossoverResult(rows=(), projections=())
    assert verdict(never) == "projected: hybrid never wins"
    assert verdict(never, TRIALS) == ("projected: hybrid never wins; measured at 2 devices: "
                                      "hybrid (dp 1 x mp 2) fastest")
    assert verdict(never, TRIALS[1:2]).endswith("DP (dp 2 x mp 1) fastest")


def test_the_chart_draws_the_trials_beside_the_projection(tmp_path):
    from placement.cluster import preset
    from placement.scaling.crossover import crossover
    from placement.scaling.efficiency import NoiseScaleModel
    from placement.scaling.step import WorkerStep

    def worker(mp: int, compute_s: float) -> WorkerStep:
        return WorkerStep(mp_degree=mp, batch=32.0, num_micro_batches=1,
                          compute_s=compute_s, backward_s=compute_s / 2,
                          gradient_bytes=1e6, param_bytes=1e6, memory_bytes=1e8)

    result = crossover([worker(1, 0.013), worker(2, 0.016)], preset("cpu"),
                       NoiseScaleModel(b_noise=256.0, min_epochs=1.0), 1e6, 8)
    path = tmp_path / "crossover.png"
    save_crossover_plot(result, path, "tiny", trials=TRIALS)
    assert path.read_bytes()[:4] == b"\x89PNG"
