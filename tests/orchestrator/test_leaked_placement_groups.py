"""Placement groups that outlive their creator: which ones count as leaked (pure), and
reclaiming a real one that Ray leaked when a driver was killed (a local Ray instance)."""

import signal
import subprocess
import sys
import time

import pytest
import ray
from ray.util.placement_group import placement_group

from orchestrator.train.cluster import ray_cluster
from orchestrator.train.leaks import PlacementGroupRecord, leaked, placement_groups_not_removed


def record(pg_id, *, job="01000000", state="CREATED", detached=False, creator=None,
           actor_created=False):
    return PlacementGroupRecord(pg_id=pg_id, job_id=job, state=state, detached=detached,
                                creator_actor_id=creator, resources={"CPU": 1.0},
                                actor_created=actor_created)


def test_only_groups_whose_job_and_creator_are_gone_are_leaked():
    groups = [
        record("dead-creator-of-dead-job", creator="dead-actor"),
        record("driver-of-dead-job"),
        record("live-job", job="02000000"),
        record("detached", detached=True),
        record("live-detached-actor-of-dead-job", creator="live-actor"),
        record("already-removed", state="REMOVED"),
        record("pending", state="PENDING"),
    ]
    asked = []

    def actor_alive(actor_id):
        asked.append(actor_id)
        return actor_id == "live-actor"

    assert [g.pg_id for g in leaked(groups, {"01000000"}, actor_alive)] == [
        "dead-creator-of-dead-job", "driver-of-dead-job", "pending"]
    assert leaked(groups, set(), actor_alive) == []
    assert sorted(asked) == ["dead-actor", "live-actor"]  # only creators of ended jobs


def test_in_a_live_job_only_the_groups_of_dead_actors_are_leaked():
    """A sweep trial stopped by ASHA: its Train controller (an actor) died, its worker
    group did not go with it, while the job (the sweep's driver) lives on."""
    groups = [
        record("dead-controller", creator="dead-actor", actor_created=True),
        record("creator-flagged-dead", actor_created=True),
        record("live-controller", creator="live-actor", actor_created=True),
        record("live-driver"),
        record("detached-of-dead-actor", creator="dead-actor", actor_created=True,
               detached=True),
    ]
    assert [g.pg_id for g in leaked(groups, set(), lambda a: a == "live-actor")] == [
        "dead-controller", "creator-flagged-dead"]


# A driver whose actor asks for placement groups without pause; killed, its job is marked
# finished a little before the actor dies, and a group registered in between is leaked.
PLACER = """
import sys, time, ray
from ray.util.placement_group import placement_group
ray.init(address=sys.argv[1])
@ray.remote(num_cpus=0)
class Placer:
    def run(self):
        while True:
            placement_group([{"CPU": 0.001}])
            time.sleep(0.001)
placers = [Placer.remote() for _ in range(2)]
for placer in placers:
    placer.run.remote()
time.sleep(1.5)
print("placing", flush=True)
time.sleep(600)
"""

# A driver that leaves a detached actor holding a group: ended job, live creator.
DETACHED = """
import sys, ray
from ray.util.placement_group import placement_group
ray.init(address=sys.argv[1], namespace="leak-test")
@ray.remote(num_cpus=0)
class Keeper:
    def place(self):
        self.group = placement_group([{"CPU": 0.25}])
        ray.get(self.group.ready())
        return self.group.id.hex()
keeper = Keeper.options(name="keeper", lifetime="detached").remote()
print(ray.get(keeper.place.remote()), flush=True)
"""


#: Drivers killed at most before the race counts as gone.
KILLS = 20


@pytest.fixture
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def cpus_free() -> float:
    return ray.available_resources().get("CPU", 0.0)


def not_removed() -> set[str]:
    return {g.pg_id for g in placement_groups_not_removed()}


@pytest.mark.ray
def test_a_group_leaked_by_a_killed_driver_is_reclaimed_and_live_ones_are_kept(
        local_ray, monkeypatch, capsys):
    own = placement_group([{"CPU": 0.5}])
    ray.get(own.ready())
    detached = subprocess.run([sys.executable, "-c", DETACHED, local_ray], capture_output=True,
                              text=True, timeout=120, check=True).stdout.split()[-1]
    before = not_removed()
    assert before == {own.id.hex(), detached}

    # Ray leaked groups in 7 of 8 kills here: the first kill nearly always does. Under
    # load (a full suite beside five CPU-bound solves, load average 12-19) eight kills
    # once leaked none, so it gets more tries; an idle box stops at the first.
    for _ in range(KILLS):
        driver = subprocess.Popen([sys.executable, "-c", PLACER, local_ray],
                                  stdout=subprocess.PIPE, text=True)
        assert driver.stdout.readline().strip() == "placing"
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        time.sleep(2)  # past the GCS's cleanup of the dead job
        leaks = not_removed() - before
        if leaks:
            break
    assert leaks, f"{KILLS} killed drivers leaked no placement group: has Ray fixed the race?"

    monkeypatch.setenv("RAY_ADDRESS", local_ray)
    with ray_cluster(None):  # joins the running instance, as a job's driver does
        pass
    out = capsys.readouterr().out
    assert all(f"removed placement group {pg_id}" in out for pg_id in leaks), out
    # Removal is asynchronous, and the resource view follows it a moment later: on a
    # loaded host (other Ray instances, five test suites) 30 s were not always enough
    # for the last 0.001-CPU bundle to come back.
    # In 1 of 3 full-suite runs of 2026-12-01 one 0.001-CPU bundle (of a group the
    # killed actor was still creating) had not come back after 90 s, with the group
    # table already clean (issue 18's note); on 2026-12-07 two had not. Each of the two
    # placer actors may be creating one group when killed: at most their two bundles
    # are allowed to lag (the wait ends once the rest is back: a lagging bundle made
    # every such run wait out the whole 90 s).
    back = pytest.approx(2 - 0.5 - 0.25, abs=0.0021)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (not_removed() == before
                                               and cpus_free() == back):
        time.sleep(0.5)
    assert not_removed() == before  # the leaks gone, the live groups kept
    assert cpus_free() == back


@ray.remote(num_cpus=0)
class Placer:
    def place(self) -> str:
        group = placement_group([{"CPU": 0.25}])
        ray.get(group.ready())
        return group.id.hex()


@pytest.mark.ray
def test_the_group_of_a_killed_actor_in_a_live_job_is_reclaimed(local_ray, capsys):
    from orchestrator.train.leaks import reclaim_leaked_placement_groups

    own = placement_group([{"CPU": 0.5}])
    ray.get(own.ready())
    killed, live = Placer.remote(), Placer.remote()
    killed_group, live_group = ray.get([killed.place.remote(), live.place.remote()])
    ray.kill(killed)
    deadline = time.monotonic() + 30
    removed: list[str] = []
    while time.monotonic() < deadline and not removed:
        removed = reclaim_leaked_placement_groups()  # once the GCS has the actor dead
        time.sleep(0.5)
    assert len(removed) == 1 and killed_group in removed[0], removed
    assert "dead creator actor" in removed[0]
    assert not_removed() == {own.id.hex(), live_group}


def test_a_run_reclaims_at_once_and_every_interval_until_it_returns(monkeypatch, capsys):
    from orchestrator.train import leaks

    looks = []
    monkeypatch.setattr(leaks, "reclaim_leaked_placement_groups",
                        lambda: looks.append(time.monotonic()) or [f"removed {len(looks)}"])
    with leaks.reclaiming_leaked_groups(every_s=0.05):
        time.sleep(0.3)
    stopped = len(looks)
    time.sleep(0.2)
    assert len(looks) == stopped >= 3  # the first at once, none after the run
    assert "removed 1" in capsys.readouterr().out
