"""Redis memory per 1,000 learner steps, consumed entries trimmed or not (docs/operations.md, "Redis memory").

    python -m benchmarks.stream_memory [--steps 1000] [--groups-per-step 64] [--group-size 8]
                                       [--max-new-tokens 2] [--prompt-tokens 32]

Drives the real bus through a bare redis-server of its own with the services' own write paths, one learner
step at a time: the reward service issues tasks (counted with each XADD) up to the groups in flight, the
coordinator's work API leases them to simulated workers and accepts their groups (its Lua scripts:
services/coordinator/work_leases.py), the reward service scores them onto `scored` (counted with the ack),
and the learner's BatchCollector reads a step's groups, which are then acked as after a checkpoint. Time
is simulated at `--steps-per-s` (10: the demo's pace), so the trimmers run every TRIM_INTERVAL_S of it.
Entry sizes are those of real messages: `group_size` samples of `max_new_tokens` tokens each (ids and
behaviour log-probs) plus a `prompt_tokens` prompt.

Prints used_memory (INFO memory) after a warm-up step and after `--steps`, for trimming on and off, the
growth per 1,000 steps, and its extrapolation to 24 h at the given pace.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import redis

from cluster.redis_server import RedisServer
from engines.interface import Sample
from services.coordinator.work_leases import WorkLeases
from services.learner.batch import BatchCollector
from services.rollout.rollout_groups import build_rollout_group
from shared import worker_rewards
from shared.bus import StreamBus
from shared.config import WorkConfig
from shared.keys import GROUPS_SCORED, TASKS_ISSUED, RunKeys
from shared.messages import LearnerState, RolloutGroup, ScoredGroup, TaskGroup
from shared.stream_trim import TRIM_INTERVAL_S, ConsumedTrimmer
from shared.streams import LEARNER_STATE, ROLLOUTS, SCORED, TASKS
from shared.work_api import SubmittedGroup

VOCAB_SIZE = 50_000


@dataclass
class SimulatedClock:
    now_s: float = 0.0

    def __call__(self) -> float:
        return self.now_s


@dataclass
class Shape:
    """The run being simulated: how big its groups are and how many a step trains."""

    groups_per_step: int = 64
    group_size: int = 8
    max_new_tokens: int = 2
    prompt_tokens: int = 32
    staleness_bound: int = 2

    @property
    def max_groups_in_flight(self) -> int:
        return self.groups_per_step * max(1, self.staleness_bound - 1)


@dataclass
class SimulatedPipeline:
    """One run's streams driven by the services' real write paths (module docstring). `trim`: whether the
    reward service and the learner trim what they consumed."""

    client: redis.Redis
    shape: Shape
    trim: bool = True
    num_workers: int = 4
    lease_ms: int = 60_000
    run_id: str = field(default_factory=lambda: f"mem-{uuid.uuid4().hex[:8]}")
    clock: SimulatedClock = field(default_factory=SimulatedClock)

    def __post_init__(self) -> None:
        self.keys = RunKeys(self.run_id)
        self.reward = StreamBus(self.client, self.keys, service="reward")
        # each simulated worker leases a whole step's groups at once and answers them at once: the cap is that
        work = WorkConfig(max_held_tasks=max(WorkConfig().max_held_tasks, self.shape.groups_per_step))
        self.work = WorkLeases(self.client, self.keys, lease_ms=self.lease_ms, config=work)
        self.collector = BatchCollector(
            StreamBus(self.client, self.keys, service="learner"),
            self.keys,
            staleness_bound=self.shape.staleness_bound,
            groups_per_step=self.shape.groups_per_step,
            vocab_size=VOCAB_SIZE,
            max_positions=self.shape.prompt_tokens + self.shape.max_new_tokens + 1,
            scored_block_ms=1,
            trim_interval_s=TRIM_INTERVAL_S if self.trim else 1e12,
            clock=self.clock,
        )
        self.reward_trimmer = ConsumedTrimmer(
            self.reward, (TASKS, ROLLOUTS), interval_s=TRIM_INTERVAL_S if self.trim else 1e12, clock=self.clock
        )
        for stream in (TASKS, ROLLOUTS, SCORED):
            self.reward.ensure_group(stream)
        self.collector.ensure_group()
        self.worker_ids = [f"w-{index}" for index in range(self.num_workers)]
        for worker_id in self.worker_ids:  # registered and active, as the coordinator's registry keeps them
            self.client.hset(self.keys.worker(worker_id), mapping={"state": "active"})
            self.client.zadd(self.keys.worker_leases, {worker_id: time.time() + 10**9})
        self.version = 0
        self.num_trained = 0

    def step(self) -> None:
        """One learner step's worth of traffic through every stage, then the learner's step itself."""
        self.issue_tasks()
        for worker_id in self.worker_ids:
            self.answer(worker_id, self.shape.groups_per_step)
        self.score()
        self.learn()
        self.clock.now_s += 1.0 / STEPS_PER_S

    def issue_tasks(self) -> None:
        self.reward_trimmer.trim_if_due()
        in_flight = (
            sum(self.reward.backlog(stream) for stream in (TASKS, ROLLOUTS)) + self.reward.group_progress(SCORED)[0]
        )
        for _ in range(self.shape.max_groups_in_flight - in_flight):
            self.reward.publish(TASKS, self.task(), tally=(self.keys.reward_counts, TASKS_ISSUED))

    def answer(self, worker_id: str, max_groups: int) -> None:
        leased = self.work.lease(worker_id, max_groups, time.time())
        groups = [SubmittedGroup(lease_id=t.lease_id, group=self.rollout(t.task, worker_id).encode()) for t in leased]
        if groups:
            self.work.submit(worker_id, groups)

    def score(self) -> None:
        while deliveries := self.reward.read(ROLLOUTS, "reward-0", count=256, block_ms=1):
            scored = [
                ScoredGroup(
                    run_id=self.run_id,
                    rollout=d.message,
                    rewards=[1.0, 0.0] * (self.shape.group_size // 2) + [0.5] * (self.shape.group_size % 2),
                )
                for d in deliveries
            ]
            self.reward.publish_and_ack(
                SCORED,
                scored,
                deliveries,
                tally=(self.keys.reward_counts, GROUPS_SCORED),
                increments=worker_rewards.increments(self.keys, scored),  # what the workers earn leases with
            )

    def learn(self) -> None:
        batch = self.collector.collect(self.version, should_stop=lambda: not self.has_scored())
        if batch is None:
            return
        self.collector.bus.ack(SCORED, batch.message_ids)  # as the learner does after the checkpoint
        self.collector.release(batch.message_ids)
        self.version += 1
        self.num_trained += len(batch.groups)
        state = LearnerState(
            run_id=self.run_id,
            status="training",
            learner_version=self.version,
            published_version=self.version,
            staleness_bound=self.shape.staleness_bound,
            num_steps_target=0,
            num_groups_trained=self.num_trained,
        )
        self.collector.bus.put_state(LEARNER_STATE, state)

    def has_scored(self) -> bool:
        lag, _ = self.collector.bus.group_progress(SCORED)
        return lag > 0 or bool(self.collector._replay)

    def task(self) -> TaskGroup:
        return TaskGroup(
            run_id=self.run_id,
            task_id=uuid.uuid4().hex,
            task_name="arithmetic",
            prompt="x" * (4 * self.shape.prompt_tokens),  # ~4 characters a token
            num_samples=self.shape.group_size,
            max_new_tokens=self.shape.max_new_tokens,
            temperature=1.0,
        )

    def rollout(self, task: TaskGroup, worker_id: str) -> RolloutGroup:
        sample = Sample(
            prompt_token_ids=[7] * self.shape.prompt_tokens,
            token_ids=[11] * self.shape.max_new_tokens,
            logprobs=[-1.0] * self.shape.max_new_tokens,
            text="y" * (4 * self.shape.max_new_tokens),
            finish_reason="length",
        )
        return build_rollout_group(task, [sample] * self.shape.group_size, worker_id, self.version, 0.01)


STEPS_PER_S = 10.0


def used_memory_bytes(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def measure(shape: Shape, num_steps: int, trim: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as data_dir, RedisServer(Path(data_dir), append_only=False) as server:
        client = redis.Redis.from_url(server.url)
        pipeline = SimulatedPipeline(client, shape, trim=trim)
        pipeline.step()  # warm-up: groups, scripts and the first entries exist
        before = used_memory_bytes(client)
        peak = before
        started_s = time.monotonic()
        for index in range(num_steps):
            pipeline.step()
            if index % 10 == 9:
                peak = max(peak, used_memory_bytes(client))
        if trim:  # the state at a trim, not between two
            pipeline.reward_trimmer.trim()
            pipeline.collector.trimmer.trim()
        after = used_memory_bytes(client)
        lengths = {stream.name: pipeline.reward.length(stream) for stream in (TASKS, ROLLOUTS, SCORED)}
        client.close()
    growth_per_1000 = (after - before) * 1000 / num_steps
    return {
        "trim": trim,
        "num_steps": num_steps,
        "used_memory_before_bytes": before,
        "used_memory_after_bytes": after,
        "used_memory_peak_bytes": peak,
        "growth_per_1000_steps_bytes": round(growth_per_1000),
        "growth_24h_bytes_at_pace": round(growth_per_1000 * STEPS_PER_S * 86_400 / 1000),
        "stream_lengths_after": lengths,
        "wall_s": round(time.monotonic() - started_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stream_memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--groups-per-step", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    args = parser.parse_args()
    shape = Shape(args.groups_per_step, args.group_size, args.max_new_tokens, args.prompt_tokens)
    results = [measure(shape, args.steps, trim) for trim in (True, False)]
    print(json.dumps({"shape": shape.__dict__, "steps_per_s": STEPS_PER_S, "results": results}, indent=2))


if __name__ == "__main__":
    main()
