"""Placement groups that Ray should have removed with their creator: found in the GCS
and removed before a job on a shared cluster asks for bundles of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import ray


@dataclass(frozen=True, kw_only=True)
class PlacementGroupRecord:
    """What the GCS knows of a placement group, as far as its lifetime goes."""

    pg_id: str
    job_id: str
    state: str
    detached: bool
    creator_actor_id: str | None
    """None for a group a driver created, or whose creator the GCS has marked dead."""
    resources: Mapping[str, float]
    """Summed over its bundles."""
    actor_created: bool = False
    """Whether an actor (not a driver) created it."""


def leaked(groups: list[PlacementGroupRecord], dead_jobs: set[str],
           actor_alive: Callable[[str], bool]) -> list[PlacementGroupRecord]:
    """Groups whose creator is gone (Ray's lifetime rule: a group that is not detached
    lives as long as the actor or driver that created it, and no longer than its job)
    but which still hold their bundles: in an ended job, those of a driver or of an actor
    that died; in a live job, those of an actor that died. `actor_alive` is asked only
    about the creators of groups that are not detached whose job has ended or that an
    actor created: each answer is a GCS lookup."""
    def creator_gone(g: PlacementGroupRecord) -> bool:
        return g.creator_actor_id is None or not actor_alive(g.creator_actor_id)

    return [g for g in groups if g.state != "REMOVED" and not g.detached
            and (g.job_id in dead_jobs or g.actor_created) and creator_gone(g)]


def placement_groups_not_removed() -> list[PlacementGroupRecord]:
    """The groups holding or waiting for bundles (the GCS also remembers removed ones)."""
    # The GCS table read directly: neither ray.util.placement_group_table() nor the State
    # API names a group's creator actor, which tells a group that a live detached actor of
    # an ended job still uses from a leaked one. The table's creator_actor_dead flag is
    # not enough: a group registered after its creator's death was processed never gets
    # it (seen in 2 of 3 groups leaked by killed drivers), so the actor table decides.
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    table = gcs_pb2.PlacementGroupTableData
    nil_actor = ray.ActorID.nil().binary()  # a driver's groups name no creator actor
    records = []
    for raw in state._connect_and_get_accessor().get_placement_group_table():
        data = table.FromString(raw)
        if data.state == table.REMOVED:
            continue
        resources: dict[str, float] = {}
        for bundle in data.bundles:
            for name, amount in bundle.unit_resources.items():
                resources[name] = resources.get(name, 0.0) + amount
        records.append(PlacementGroupRecord(
            pg_id=data.placement_group_id.hex(), job_id=data.creator_job_id.hex(),
            state=table.PlacementGroupState.Name(data.state), detached=data.is_detached,
            creator_actor_id=None if data.creator_actor_dead else data.creator_actor_id.hex(),
            resources=resources, actor_created=data.creator_actor_id != nil_actor))
    return records


def reclaim_leaked_placement_groups() -> list[str]:
    """Remove the placement groups Ray should have removed with their creator, and say
    which. Ray 2.60's GCS leaks one when a dying job's actor asks for it after the job was
    marked finished: a driver killed while a trial's worker group was being placed left
    a group of two CPU bundles that the GCS registered 70 ms after "Marking job as
    finished" (CI's Ray logs), and the resumed sweep's trial waited for those CPUs for 30
    minutes. And it keeps the group of an actor killed in a live job: a sweep trial that
    ASHA stopped left its Train controller's worker group (2 x 1 CPU) CREATED minutes
    after the controller died, beside a live PlacementGroupCleaner, and the next trial's
    worker group waited for those CPUs until the demo was killed (3 of 5 demos on a
    loaded host, 2026-12-02). Returns one line per group removed."""
    from ray._private.state import actors, jobs
    from ray.util.placement_group import PlacementGroup

    def actor_alive(actor_id: str) -> bool:
        return actors(actor_id=actor_id).get("State", "DEAD") != "DEAD"

    dead_jobs = {job["JobID"] for job in jobs() if job["IsDead"]}
    lines = []
    for group in leaked(placement_groups_not_removed(), dead_jobs, actor_alive):
        ray.util.remove_placement_group(
            PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group.pg_id))))
        held = ", ".join(f"{name} {amount:g}"
                         for name, amount in sorted(group.resources.items()))
        lines.append(f"removed placement group {group.pg_id} ({held}) left behind by "
                     + (f"ended job {group.job_id}: Ray misses a group requested as its job "
                        "ends" if group.job_id in dead_jobs else
                        "its dead creator actor: Ray keeps the group of a killed actor"))
    return lines


#: Seconds between looks for leaked groups while a training run waits for or holds its
#: worker group (`reclaiming_leaked_groups`).
RECLAIM_EVERY_S = 5.0


@contextmanager
def reclaiming_leaked_groups(every_s: float = RECLAIM_EVERY_S) -> Iterator[None]:
    """While a TorchTrainer runs (a sweep trial's or the final one), reclaim leaked
    groups now and every `every_s`, saying which: the Train controller of a trial that
    ASHA stopped, or that Tune ended a moment after its run returned, may die before
    its worker group is removed, and the next run's workers would wait for those CPUs
    forever (seen for the next trial and for the final run, 2026-12-02). A loop, not one
    look: the other controller may die a moment after this run starts."""
    stop = threading.Event()

    def loop() -> None:
        while True:
            for line in reclaim_leaked_placement_groups():
                print(line, flush=True)
            if stop.wait(every_s):
                return

    looker = threading.Thread(target=loop, name="reclaim-leaked-groups", daemon=True)
    looker.start()
    try:
        yield
    finally:
        stop.set()
        looker.join()
