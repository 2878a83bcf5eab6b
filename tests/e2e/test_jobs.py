"""The product as a user runs it: `ray start --head`, `ray job submit --working-dir .
-- python jobs/<model>.py ...`, then the storage path holds TensorBoard logs per trial,
the report and the winner. Slow (minutes): one Ray instance serves every job here."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from ray.util.state import list_actors

from placement.sweep_space import TIMED
from tests.conftest import REPO

pytestmark = pytest.mark.ray

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    """A head node on loopback, auth off for start and submit alike (RAY_NOTES.md).

    `ray start` runs in a process group of its own, which every process of the head
    stays in (Ray starts them without a session of their own), and the teardown kills
    that group: `ray stop` would end every Ray instance on the machine, the Ray sessions
    of the suite's other test process (and anyone else's) too."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{BIN}:{os.environ['PATH']}"}
    # Every port its own: Ray's fixed defaults (the job agent's 52365, the client
    # server's 10001) are taken when the suite's other process runs Ray at the same
    # time, and a head whose job agent cannot bind refuses every submission.
    port, dashboard, agent, client = (free_port() for _ in range(4))
    # Short: Ray's socket paths under it must fit AF_UNIX's 107 bytes, which a folder
    # under pytest's (per-worker) base temp does not. Not under RAY_TMPDIR either: the
    # killed head's address file would stay there for this process's next `ray.init()`.
    temp = tempfile.mkdtemp(prefix="ray-e2e-", dir="/tmp")
    start = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
         f"--dashboard-port={dashboard}", "--dashboard-host=127.0.0.1",
         f"--dashboard-agent-listen-port={agent}", f"--ray-client-server-port={client}",
         "--num-cpus=2",
         "--disable-usage-stats", f"--temp-dir={temp}",
         '--resources={"orchestrator_driver": 1000}'],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        output, _ = start.communicate(timeout=120)
        assert start.returncode == 0, output[-4000:]
        yield {"env": env, "address": f"http://127.0.0.1:{dashboard}",
               "gcs": f"127.0.0.1:{port}"}
    finally:
        kill_process_group(start.pid)


def kill_process_group(pgid: int, timeout_s: float = 60) -> None:
    """SIGKILL to the group (what `ray stop --force` sends each Ray process), then wait
    until it is gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.2)


def ray_cli(head, *args: str) -> str:
    try:
        result = subprocess.run([str(BIN / "ray"), *args], env=head["env"],
                                capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return f"ray {' '.join(args)}: no answer in 120 s"
    return result.stdout + result.stderr


def cluster_state(head, submission_id: str) -> str:
    """What holds the cluster: its resource usage, live placement groups and actors, and
    the end of the job's log."""
    api = f"--address={head['address']}"
    return "\n".join([
        ray_cli(head, "status", f"--address={head['gcs']}"),
        ray_cli(head, "list", "placement-groups", api, "--filter", "state!=REMOVED"),
        ray_cli(head, "list", "actors", api, "--filter", "state=ALIVE"),
        ray_cli(head, "job", "logs", api, submission_id)[-4000:],
    ])


def preemption_watchers(head) -> int:
    """How many Ray Train preemption watchers the cluster has started, dead ones too."""
    return len(list_actors(address=head["address"], limit=10_000,
                           filters=[("class_name", "=", "PreemptionWatcher")]))


def submit(head, job: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`ray job submit`, waiting for the job. A job still running at `timeout` is stopped
    (the client giving up would leave it holding the cluster for every test after it) and
    the test fails with what the cluster was holding."""
    # The head's job agent can take a while to register (and re-register under load):
    # Ray answers "No available agent" then, before the job exists, so retrying is safe.
    for _ in range(10):
        submission_id = f"test-{uuid.uuid4().hex[:12]}"
        try:
            result = subprocess.run(
                [str(BIN / "ray"), "job", "submit", f"--address={head['address']}",
                 f"--submission-id={submission_id}", "--working-dir", str(REPO), "--",
                 "python", f"jobs/{job}", *args],
                env=head["env"], cwd=REPO, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            state = cluster_state(head, submission_id)
            ray_cli(head, "job", "stop", f"--address={head['address']}", submission_id)
            pytest.fail(f"jobs/{job} {' '.join(args)} still ran after {timeout} s; "
                        f"the cluster then:\n{state}")
        if "No available agent to submit job" not in result.stdout + result.stderr:
            return result
        time.sleep(6)
    return result


def add_unrecorded_running_trial(experiment: Path) -> None:
    """Make the searcher's saved states hold one more trial, still running, of a
    candidate no recorded trial has: the sweep would wait for it forever, and never try
    its candidate, unless the resumed searcher follows the record."""
    from ray.tune import ExperimentAnalysis

    from orchestrator.search import CorrectedSearcher
    from placement.sweep_space import Candidate

    recorded = {Candidate.from_dict(t.config["candidate"]).key()
                for t in ExperimentAnalysis(str(experiment)).trials}
    for saved in experiment.glob("searcher-state-*.pkl"):
        searcher = CorrectedSearcher([], max_trials=0, metric="x", probe=lambda: 0.0)
        searcher.restore(str(saved))
        tried = recorded | {c.key() for c in searcher.suggested.values()}
        phantom = next(c for c in searcher.candidates if c.key() not in tried)
        searcher.suggested["unrecorded"] = phantom
        searcher.running.add("unrecorded")
        searcher.save(str(saved))


def terminated_trials(storage: Path) -> list[str]:
    """Ids of the trials Tune's saved experiment state marks finished."""
    trials = []
    for state in storage.glob("sweep/experiment_state-*.json"):
        try:
            data = json.loads(state.read_text())
        except json.JSONDecodeError:  # caught mid-write; read it on the next poll
            continue
        # Each entry is [trial's JSON state, its runtime metadata].
        trials += [t["trial_id"] for t in (json.loads(entry[0]) for entry in data["trial_data"])
                   if t.get("status") == "TERMINATED"]
    return trials


def assert_succeeded(result: subprocess.CompletedProcess) -> None:
    """`ray job submit` waits for the job and ends with "Job '<id>' succeeded"."""
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert re.search(r"Job '[^']+' succeeded", output), output[-4000:]


def assert_report_renders(page: Path, screenshot: Path) -> None:
    """Every plot loads in headless Chromium (the page counts them itself); a screenshot
    is left for a person to look at."""
    chromium = shutil.which("chromium")
    assert chromium, "chromium is missing: scripts/setup.sh installs it with apt"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    assert f'data-images-loaded="{len(PLOTS)}/{len(PLOTS)}"' in dom, dom[-2000:]
    subprocess.run([chromium, *flags, "--window-size=1200,1700", f"--screenshot={screenshot}",
                    page.as_uri()], capture_output=True, timeout=120)
    assert screenshot.read_bytes()[:4] == b"\x89PNG"


#: The planning stage's budget in the tests that check a job runs through, not what it
#: predicts (the default, 20 s, was a fifth of each of those jobs).
QUICK_PLANS = ("--plan-time-limit", "4")
PLOTS = ("predicted_vs_measured.png", "breakdown.png", "sweep.png", "losses.png",
         "crossover.png", "plan.png")
TRIAL_FIELDS = {"mp_degree", "dp_degree", "global_batch", "num_micro_batches",
                "predicted_step_s", "measured_step_s", "projected_time_s", "correction",
                "breakdown_s"}


def check_results(storage: Path, num_trials: int) -> dict:
    winner = json.loads((storage / "winner.json").read_text())
    assert len(winner["final"]["losses"]) > 0
    assert len(winner["trials"]) == num_trials
    folders = []
    for t in winner["trials"]:
        assert TRIAL_FIELDS <= set(t), TRIAL_FIELDS - set(t)
        (trial,) = (storage / "sweep").glob(f"_trial_{t['trial_id']}_*")
        assert list(trial.glob("events.out.tfevents.*")), f"no TensorBoard events in {trial}"
        folders.append(trial)
    # A trial a killed driver started but never recorded is set aside on --resume.
    assert sorted((storage / "sweep").glob("_trial_*")) == sorted(folders)
    assert (storage / "report" / "index.html").is_file()
    for plot in PLOTS:
        assert (storage / "report" / plot).read_bytes()[:4] == b"\x89PNG"
    return winner


def assert_every_mp_degree_ranked(winner: dict) -> None:
    """Every mp_degree was tried, its step timed before the sweep with its dp workers side
    by side, and the trials after the first of each mp_degree were ranked from that
    first one's own timing and the ratio it measured against it (placement/sweep_rank.py).
    (Whether those predictions hold within the issue's 15% is a figure of the run, in
    docs/benchmarks.md "Sweep", not an assertion: on this 2-core box the mp 2 step differs
    from one process to the next by 13% (coefficient of variation, quiet box), and other
    sessions' load moves a trial's share of the cores from one trial to the next; this
    test's calibrated trial measured +26.8% at commit 2daf620 on a quiet box, within 15%
    of its own run's host-speed probe, which no prediction made before it can know.)"""
    trials = winner["trials"]
    assert {t["mp_degree"] for t in trials} >= {1, 2}, [t["key"] for t in trials]
    assert {t["mp_degree"] for t in winner["timed_steps"]} >= {1, 2}
    calibrated = [t for t in trials if t["calibrated"]]
    assert calibrated, [t["key"] for t in trials]
    # Every trial timed its own step in its workers before its first step, and the later
    # trials of its mp_degree ranked from that timing (sweep_rank.py).
    assert all(t["timed_here_step_s"] > 0 for t in trials), trials
    assert all("timed in" in t["correction_from"] for t in calibrated), calibrated
    # The host-speed probe: the driver's right before it ranked each trial, the trial's
    # between its steps and after its timing's rounds; and what a calibrated trial's
    # earlier trials' level carried to the driver's probe predicted.
    for t in trials:
        assert all(1e-4 < t[k] < 0.05 for k in ("ranked_probe_s", "probe_s",
                                                 "timed_here_probe_s")), t
    assert all("host-speed probe" in t["at_speed_from"] for t in calibrated), calibrated
    for t in trials:
        assert t["step_source"] == TIMED, t
        assert t["measured_step_s"] > 0 and t["predicted_step_s"] > 0, t
        assert t["error"] == pytest.approx(t["measured_step_s"] / t["predicted_step_s"] - 1)
        # The cores the trial's worker and its timing kept busy: what explains a miss.
        assert t["cores_used"] > 0 and t["predicted_cores"] > 0, t


def test_biglstm_job_interrupted_then_resumed(ray_head, tmp_path):
    storage = tmp_path / "biglstm"
    watchers_before = preemption_watchers(ray_head)
    # Three trials: mp 1 and mp 2 first, then one ranked with its mp_degree's correction.
    # 60 steps, as in `make demo`: a trial's median then spans a few seconds of this
    # shared host's load, not a fraction of one.
    args = ["--preset", "tiny", "--max-trials", "3", "--trial-steps", "60",
            "--final-steps", "4", "--storage", str(storage)]
    # The driver is killed once the first trial has finished; --resume must not run it again.
    driver = subprocess.Popen([sys.executable, "jobs/bigLSTM.py", *args], cwd=REPO,
                              env={**ray_head["env"], "RAY_ADDRESS": ray_head["gcs"]},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and not (finished := terminated_trials(storage)):
        time.sleep(2)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    assert finished, "no trial finished before the deadline"
    first = next(storage.glob(f"sweep/_trial_{finished[0]}_*"))
    reports_before = (first / "result.json").read_text()
    # The searcher's saved state a moment off the trials' record, as a driver killed
    # while Tune copied them leaves it: a trial the record never got, still running.
    add_unrecorded_running_trial(storage / "sweep")

    result = submit(ray_head, "bigLSTM.py", *args, "--resume")
    assert_succeeded(result)
    winner = check_results(storage, num_trials=3)
    assert (first / "result.json").read_text() == reports_before  # not run again
    assert winner["model"] == "biglstm"
    assert_every_mp_degree_ranked(winner)
    assert len({t["key"] for t in winner["trials"]}) == 3  # the resumed searcher repeats none
    assert_report_renders(storage / "report" / "index.html", tmp_path / "report.png")
    # Only the final run's: a sweep trial starts none beside its measured steps (sweep.py).
    assert preemption_watchers(ray_head) - watchers_before == 1


@pytest.mark.parametrize("job, model", [("gnmt.py", "gnmt"), ("inception_v3.py", "inception_v3")])
def test_other_models_jobs(ray_head, tmp_path, job, model):
    storage = tmp_path / model
    result = submit(ray_head, job, "--preset", "tiny", "--max-trials", "1",
                    "--trial-steps", "2", "--final-steps", "2", *QUICK_PLANS,
                    "--storage", str(storage))
    assert_succeeded(result)
    assert check_results(storage, num_trials=1)["model"] == model


def test_a_model_of_your_own_through_the_sweep_job(ray_head, tmp_path):
    """jobs/train.py --model MODULE:FUNCTION under `ray job submit --working-dir .`: the
    user's module is imported from the working directory on the driver and the workers,
    its data set feeds every trial, and its noise scale is measured (it has no figures)."""
    storage = tmp_path / "mlp"
    result = submit(ray_head, "train.py", "--model", "tests.orchestrator.user_models:mlp_dataset",
                    "--max-trials", "2", "--trial-steps", "2", "--final-steps", "2",
                    "--calibration-steps", "4", *QUICK_PLANS, "--storage", str(storage))
    assert_succeeded(result)
    winner = check_results(storage, num_trials=2)
    assert winner["model"] == "tests.orchestrator.user_models:mlp_dataset"
    assert winner["base_batch"] == 8 and winner["dataset_size"] == 64
    assert "measured in 4 calibration steps" in winner["statistical_efficiency"]
