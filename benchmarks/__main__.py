"""Run every benchmark area, or the ones named: `python -m benchmarks baselines milp`."""

import importlib
import sys

AREAS = ("baselines", "profile", "layerwise", "crossover", "runtime", "milp", "max_load",
         "user_models", "executor_overhead", "planner_step")


def main(argv: list[str]) -> int:
    names = argv or list(AREAS)
    unknown = sorted(set(names) - set(AREAS))
    if unknown:
        print(f"benchmarks: unknown area(s) {', '.join(unknown)}: choose from "
              f"{', '.join(AREAS)}", file=sys.stderr)
        return 2
    for name in names:
        print(f"\n### {name}\n", flush=True)
        importlib.import_module(f"benchmarks.{name}").main([])
    return 0


sys.exit(main(sys.argv[1:]))
