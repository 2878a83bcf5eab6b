"""The relaxed sequence DP's test at the gap line, run in a process of its own.

The max-load planner's stages (bounds, the DP's climb, the MILP rounds, the searches)
run one after another on one core. The relaxation's test at the 2% line
(`sequence_dp.relaxed_bound`) is one long numpy loop that needs nothing from them but
its inputs, so on a machine with a core to spare it runs there from the first good
incumbent on, beside every later stage, and the planner reads its proof at the end.
On the 12-layer Llama of `benchmarks.op_graphs` that test needs 31-46 s after 9-10 s
of tables, where the minute's sequential stages left it about 24 (and its pace check,
misled by the states' peak in the first third of the walk, stopped it sooner).

A child interpreter (`python -m placement.line_process FILE`), not `multiprocessing`:
its spawn and forkserver starts import the caller's main module again (a job script
without a main guard would run again), and forking a Ray worker's threads can leave
the child holding a lock no thread will release.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from placement.sequence_dp import line_test
from placement.tasks import TaskGraph

#: What the child prints when its test proves the bound out (anything else: no proof).
PROVEN = "proven"


def spare_core(threads: int | None) -> bool:
    """Whether the planner may take a second core: the caller did not ask for one
    thread, and this process may run on two or more."""
    if threads == 1:
        return False
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    return cores >= 2


class LineProcess:
    """`sequence_dp.line_test` on the given arguments in a child process, which stops
    by `deadline` (a `time.perf_counter()` value of this process)."""

    def __init__(self, tg: TaskGraph, units: Sequence[Sequence[int]], num_devices: int,
                 light: float, bound: float, deadline: float, max_states: int,
                 merge: float) -> None:
        self.bound = bound
        self._result: bool | None = None
        self.failure: str | None = None
        """Why the child gave no answer (it crashed), for the plan's notes."""
        handle, self._path = tempfile.mkstemp(prefix="line-test-", suffix=".pickle")
        # The child counts its time from the seconds left when it was sent off, less
        # what passed before it started (clocks are compared only within a process).
        with os.fdopen(handle, "wb") as f:
            pickle.dump((tg, [list(u) for u in units], num_devices, light, bound,
                         deadline - time.perf_counter(), time.time(), max_states, merge),
                        f)
        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [root, *filter(None, [env.get("PYTHONPATH")])])
        # Its errors go to a file: a pipe nobody reads until the end could fill and
        # stall the child.
        self._err = tempfile.TemporaryFile(mode="w+")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "placement.line_process", self._path],
                stdout=subprocess.PIPE, stderr=self._err, stdin=subprocess.DEVNULL,
                env=env, text=True)
        except OSError:
            self._err.close()
            Path(self._path).unlink(missing_ok=True)
            raise

    def proven(self, wait_until: float | None = None) -> bool:
        """Whether the child has proved `bound` out; with `wait_until` (a
        `time.perf_counter()` value), waits for its answer until then."""
        if self._result is None:
            if self._proc.poll() is None:
                if wait_until is None:
                    return False
                try:
                    self._proc.wait(timeout=max(0.0, wait_until - time.perf_counter()))
                except subprocess.TimeoutExpired:
                    return False
            # It has exited (communicate with a timeout gives up before reading once
            # the time is past, however much waits in the pipes).
            out, _ = self._proc.communicate()
            self._result = out.strip() == PROVEN
            if self._proc.returncode != 0:
                self._err.seek(0)
                lines = self._err.read().strip().splitlines()
                self.failure = (f"exit status {self._proc.returncode}"
                                + (f": {lines[-1]}" if lines else ""))
        return self._result

    def close(self) -> None:
        """Stop the child if it still runs, and remove its input."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.communicate()
            if self._result is None:
                self._result = False  # stopped before it answered: no proof, no failure
        else:
            self.proven()  # its answer, read before its error file goes
        self._err.close()
        Path(self._path).unlink(missing_ok=True)


def main(path: str) -> None:
    with open(path, "rb") as f:
        (tg, units, num_devices, light, bound, seconds, sent, max_states,
         merge) = pickle.load(f)
    Path(path).unlink(missing_ok=True)  # read once: nothing is left if the planner dies
    deadline = time.perf_counter() + seconds - max(0.0, time.time() - sent)
    proven = line_test(tg, units, num_devices, light, bound, deadline, max_states, merge)
    print(PROVEN if proven else "not proven", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
