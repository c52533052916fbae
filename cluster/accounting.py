"""Task accounting: where every task the reward service issued ended up, read from Redis after a run.

Work starts when the reward service issues a task; every later stage is counted where it happens, in the
same transaction or script as the stream operation it counts, so the figures stay exact however much of
the streams has been trimmed (shared/stream_trim.py) and whatever garbage they hold (nothing here decodes
an entry):

    tasks issued     = groups produced + tasks dead-lettered by the work API + tasks unleased + tasks held
    groups produced  = groups scored + dead-lettered by the reward service + pending at the reward service
    groups scored    = trained + dropped by reason + dead-lettered by the learner + pending at the learner
so  tasks issued     = trained + dropped + dead-lettered (any stage) + pending (any stage), which
`num_unaccounted` checks (0: nothing lost). `unaccounted_by_stage` says at which stage a loss happened.

Per worker (the work API's counters, shared/work_counts.py): leased = accepted + failed + expired + held,
held being the worker's pending entries of `tasks` (a lease is one: services/coordinator/work_leases.py). They
are read as the coordinator reads them for GET /v1/work/accounting (shared/work_counts.py read_work_counts).

Sources, each written by a trusted service only:
    tasks issued, groups scored       RunKeys.reward_counts (reward service, with the XADD)
    groups produced, per-worker rows  RunKeys.work_totals / work_counts / work_worker_ids (coordinator,
                                      with the XADD to `rollouts` and the task's ack)
    dead letters of rollouts, scored  RunKeys.dead_letter_counts (shared/bus.py, with the ack)
    tasks dead-lettered by the work   Redis's own group counters of `tasks`: entries delivered minus those
      API (failed, leased too often,  still pending = tasks acked; minus groups produced (the only other
      undecodable)                    ack). Only the coordinator acks `tasks`.
    dropped by reason                 RunKeys.learner_decisions (learner, with the ack)
    trained                           LearnerState.num_groups_trained (checkpointed with the step)
    pending                           XINFO GROUPS: lag (never delivered) + pending (delivered, unacked)

Read it once every consumer has stopped (the runner does, before stopping Redis), or the counts move
while they are read. A learner stopped between a step and its checkpoint counts those groups both as
trained and as pending (they are trained again after a restart).
"""

from __future__ import annotations

from typing import Any, cast

import redis
from pydantic import BaseModel, ConfigDict, Field

from shared.api import WorkCounts
from shared.bus import StreamBus, connect, redis_text
from shared.keys import DEAD_LETTERED, GROUPS_SCORED, TASKS_ISSUED, RunKeys
from shared.messages import MessageDecodeError
from shared.streams import LEARNER_STATE, ROLLOUTS, SCORED, TASKS, Stream
from shared.work_counts import parse_counts, read_work_counts


class StreamProgress(BaseModel):
    """One stream and its consumer group as Redis counts them (XINFO), whatever was trimmed since."""

    model_config = ConfigDict(extra="forbid")

    num_added: int = Field(description="entries ever added (XINFO STREAM entries-added)")
    num_delivered: int = Field(description="entries ever delivered to the group (entries-read)")
    num_unread: int = Field(description="entries never delivered to the group (lag)")
    num_pending: int = Field(description="entries delivered and not acked")

    @property
    def num_acked(self) -> int:
        return self.num_delivered - self.num_pending


class WorkerAccounting(WorkCounts):
    """One worker's row: its counts as GET /v1/work/accounting serves them (shared/api.py WorkCounts; `held`: its
    pending entries of `tasks`), and its id."""

    worker_id: str


class GroupAccounting(BaseModel):
    """<run_dir>/accounting.json; the run report's `accounting` section."""

    model_config = ConfigDict(extra="forbid")

    num_tasks_issued: int = Field(0, description="tasks the reward service put on `tasks`")
    num_produced: int = Field(description="groups the work API accepted onto `rollouts`")
    num_scored: int = Field(description="groups the reward service scored onto `scored`")
    num_trained: int = Field(description="groups trained on, each once (LearnerState.num_groups_trained)")
    num_dropped: dict[str, int] = Field(description="groups the learner dropped, by reason")
    num_dead_lettered_work: int = Field(0, description="tasks the work API dead-lettered (failed, over-leased)")
    num_dead_lettered_reward: int = Field(description="rollouts the reward service dead-lettered")
    num_dead_lettered_learner: int = Field(description="scored groups dead-lettered at the learner")
    num_unleased: int = Field(0, description="tasks never leased to any worker")
    num_held: int = Field(0, description="tasks leased and not answered yet")
    num_pending_reward: int = Field(description="rollouts not yet scored (never delivered or unacked)")
    num_pending_learner: int = Field(description="scored groups not yet decided by the learner")
    num_failed: int = Field(0, description="of the work API's dead letters: tasks a worker reported it could not serve")
    num_expired: int = Field(0, description="leases that expired unanswered (the task went to another worker)")
    num_refused: int = Field(0, description="answers the work API refused (not held, duplicate, malformed)")
    streams: dict[str, StreamProgress] = Field(default_factory=dict, description="Redis's own counts, by stream")
    workers: list[WorkerAccounting] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list, description="sources that could not be read as expected")

    @property
    def num_pending(self) -> int:
        return self.num_unleased + self.num_held + self.num_pending_reward + self.num_pending_learner

    @property
    def num_dead_lettered(self) -> int:
        return self.num_dead_lettered_work + self.num_dead_lettered_reward + self.num_dead_lettered_learner

    @property
    def num_accounted(self) -> int:
        return self.num_trained + sum(self.num_dropped.values()) + self.num_dead_lettered + self.num_pending

    @property
    def num_unaccounted(self) -> int:
        """issued - (trained + dropped + dead-lettered + pending): 0 when nothing was lost."""
        return self.num_tasks_issued - self.num_accounted

    @property
    def unaccounted_by_stage(self) -> dict[str, int]:
        """The loss (or surplus, negative) at each stage; they sum to `num_unaccounted`."""
        return {
            "tasks": self.num_tasks_issued
            - (self.num_produced + self.num_dead_lettered_work + self.num_unleased + self.num_held),
            "rollouts": self.num_produced - (self.num_scored + self.num_dead_lettered_reward + self.num_pending_reward),
            "scored": self.num_scored
            - (
                self.num_trained
                + sum(self.num_dropped.values())
                + self.num_dead_lettered_learner
                + self.num_pending_learner
            ),
        }

    @property
    def num_unaccounted_workers(self) -> int:
        """Leases no worker row accounts for, plus held leases the rows and Redis disagree on."""
        rows_held = sum(worker.held for worker in self.workers)
        return sum(abs(worker.num_unaccounted) for worker in self.workers) + abs(
            rows_held - self.num_held if self.workers else 0
        )

    def summary(self) -> dict[str, Any]:
        """The counts and their TOTALS, as people read them (the run report, `python -m cluster.accounting`)."""
        return {**self.model_dump(), **{name: getattr(self, name) for name in TOTALS}}


# GroupAccounting's derived counts, written out next to the counts (summary) and computed again on reading
TOTALS = (
    "num_dead_lettered",
    "num_pending",
    "num_accounted",
    "num_unaccounted",
    "unaccounted_by_stage",
    "num_unaccounted_workers",
)


def count_groups(redis_url: str, run_id: str) -> GroupAccounting:
    """The accounting of run `run_id` as Redis holds it now."""
    client = connect(redis_url, socket_timeout_s=10.0)
    try:
        bus = StreamBus(client, RunKeys(run_id), service="accounting")
        return groups_of(bus)
    finally:
        client.close()


def groups_of(bus: StreamBus) -> GroupAccounting:
    keys = bus.keys
    problems: list[str] = []
    reward = _counts(bus, keys.reward_counts, problems)
    work = read_work_counts(bus.redis, keys)
    problems += work.problems
    dead = _counts(bus, keys.dead_letter_counts, problems)
    decisions = _counts(bus, keys.learner_decisions, problems)
    streams = {stream.name: _progress(bus, stream) for stream in (TASKS, ROLLOUTS, SCORED)}
    tasks = streams[TASKS.name]
    num_produced = work.totals.accepted
    return GroupAccounting(
        num_tasks_issued=reward.get(TASKS_ISSUED, 0),
        num_produced=num_produced,
        num_scored=reward.get(GROUPS_SCORED, 0),
        num_trained=_num_trained(bus, problems),
        num_dropped={reason: count for reason, count in sorted(decisions.items()) if reason != DEAD_LETTERED},
        # every ack of `tasks` is the work API's: a group accepted, or the task dead-lettered
        num_dead_lettered_work=tasks.num_acked - num_produced,
        num_dead_lettered_reward=dead.get(ROLLOUTS.name, 0),
        num_dead_lettered_learner=dead.get(SCORED.name, 0),
        num_unleased=tasks.num_unread,
        num_held=tasks.num_pending,
        num_pending_reward=streams[ROLLOUTS.name].num_unread + streams[ROLLOUTS.name].num_pending,
        num_pending_learner=streams[SCORED.name].num_unread + streams[SCORED.name].num_pending,
        num_failed=work.totals.failed,
        num_expired=work.totals.expired,
        num_refused=work.totals.refused,
        streams=streams,
        workers=[
            WorkerAccounting(worker_id=worker_id, **counts.model_dump()) for worker_id, counts in work.workers.items()
        ],
        problems=problems,
    )


def _counts(bus: StreamBus, key: str, problems: list[str]) -> dict[str, int]:
    """A counter hash; a field that is not a count is left out and named in `problems`."""
    return parse_counts(cast(dict[bytes, bytes], bus.redis.hgetall(key)), key, problems)


def _progress(bus: StreamBus, stream: Stream[Any]) -> StreamProgress:
    """Redis's counts of `stream` and its group (zeros when either does not exist yet)."""
    name = bus.keys.name_of(stream)
    try:
        num_added = int(bus.redis.xinfo_stream(name)["entries-added"])
        groups = bus.redis.xinfo_groups(name)
    except redis.ResponseError:  # no such stream
        return StreamProgress(num_added=0, num_delivered=0, num_unread=0, num_pending=0)
    info = next((g for g in groups if redis_text(g.get("name"), errors="replace") == stream.group), None)
    if info is None:  # nobody ever consumed it: everything is unread
        return StreamProgress(num_added=num_added, num_delivered=0, num_unread=num_added, num_pending=0)
    delivered = info.get("entries-read")
    lag = info.get("lag")
    num_delivered = int(delivered) if delivered is not None else num_added - int(lag or 0)
    num_unread = int(lag) if lag is not None else num_added - num_delivered
    return StreamProgress(
        num_added=num_added, num_delivered=num_delivered, num_unread=num_unread, num_pending=int(info["pending"])
    )


def _num_trained(bus: StreamBus, problems: list[str]) -> int:
    try:
        state = bus.get_state(LEARNER_STATE)
    except MessageDecodeError as exc:
        problems.append(f"the learner state is undecodable ({exc}): trained groups unknown, counted 0")
        return 0
    return state.num_groups_trained if state is not None else 0


def main(argv: list[str] | None = None) -> None:
    """`python -m cluster.accounting --run-id <id>`: the run's group accounting as JSON, read with the Redis URL
    in RL_REDIS_URL (an operator's: it reads every stream). Read it once every consumer has stopped (above);
    exits 1 when a group is unaccounted for."""
    import argparse
    import json
    import sys

    from cluster.tool_settings import tool_settings

    parser = argparse.ArgumentParser(prog="python -m cluster.accounting", description=main.__doc__)
    parser.add_argument("--run-id", required=True)
    args = parser.parse_args(argv)
    redis_url = tool_settings("python -m cluster.accounting").redis_url
    if not redis_url:
        raise SystemExit("set RL_REDIS_URL (an operator's Redis URL)")
    accounting = count_groups(redis_url, args.run_id)
    print(json.dumps({**accounting.model_dump(mode="json"), **accounting.summary()}, indent=2))
    if accounting.num_unaccounted != 0 or accounting.num_unaccounted_workers != 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
