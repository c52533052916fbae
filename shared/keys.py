"""Names of every Redis stream and key of one run, in one place.

All names start with `rl:<run_id>:` so runs (and tests, which use a fresh run id each) never share state.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunKeys:
    run_id: str

    @property
    def prefix(self) -> str:
        return f"rl:{self.run_id}:"

    # streams
    @property
    def tasks(self) -> str:
        """reward (data plane) -> rollout: prompts to sample groups for."""
        return self.prefix + "tasks"

    @property
    def rollouts(self) -> str:
        """rollout -> reward: sampled groups with behaviour logprobs."""
        return self.prefix + "rollouts"

    @property
    def scored(self) -> str:
        """reward -> learner: groups with rewards."""
        return self.prefix + "scored"

    @property
    def weights(self) -> str:
        """learner -> everyone: WeightsPublished announcements (read with XREVRANGE, no group)."""
        return self.prefix + "weights"

    @property
    def dead(self) -> str:
        """any consumer -> people: DeadLetter entries."""
        return self.prefix + "dead"

    # keys
    @property
    def learner_state(self) -> str:
        """learner -> coordinator: LearnerState (msgpack) under one key."""
        return self.prefix + "learner:state"

    def task_reference(self, task_id: str) -> str:
        """reward -> reward: the verifier's reference for a task, kept out of the workers' hands."""
        return self.prefix + f"task:{task_id}"

    @property
    def worker_ids(self) -> str:
        """coordinator: set of registered worker ids."""
        return self.prefix + "workers"

    def worker(self, worker_id: str) -> str:
        """coordinator: hash with one worker's record."""
        return self.prefix + f"worker:{worker_id}"

    @property
    def worker_leases(self) -> str:
        """coordinator: sorted set worker_id -> lease expiry (unix seconds)."""
        return self.prefix + "leases"

    @property
    def broadcast_times(self) -> str:
        """coordinator: hash policy_version -> seconds from announcement to the last active worker's swap (T_bcast)."""
        return self.prefix + "broadcast:seconds"

    @property
    def relay_plan(self) -> str:
        """coordinator: the current relay plan (who fetches weights from whom)."""
        return self.prefix + "broadcast:plan"

    def broadcast_swaps(self, policy_version: int) -> str:
        """coordinator: hash worker_id -> unix time it swapped in `policy_version` (from heartbeats)."""
        return self.prefix + f"broadcast:swaps:{policy_version}"

    @property
    def broadcast_announced(self) -> str:
        """coordinator: hash policy_version -> unix time the learner announced it."""
        return self.prefix + "broadcast:announced"

    @property
    def broadcast_pending(self) -> str:
        """coordinator: sorted set of versions whose T_bcast is not known yet (score: announced at)."""
        return self.prefix + "broadcast:pending"

    @property
    def broadcast_last_swap(self) -> str:
        """coordinator: hash worker_id -> "<version>:<swapped_at_s>" of its latest reported swap."""
        return self.prefix + "broadcast:last-swap"

    @property
    def broadcast_throughput(self) -> str:
        """coordinator: hash worker_id -> Mbit/s it achieved on its last large enough version (relay ranking)."""
        return self.prefix + "broadcast:throughput"

    @property
    def cost_ledger(self) -> str:
        """coordinator: hash of cumulative cost (learner + active workers, billed while active)."""
        return self.prefix + "cost:ledger"

    @property
    def learner_history(self) -> str:
        """coordinator: list of JSON points (version, reward, utilization, cost) for the dashboard, newest last."""
        return self.prefix + "learner:history"

    @property
    def coordinator_meta(self) -> str:
        """coordinator: hash of run-level facts (staleness bound, ...)."""
        return self.prefix + "coordinator"


class ConsumerGroups:
    """The consumer group reading each stream (one group per consuming service)."""

    TASKS = "rollout"  # rollout workers read `tasks`
    ROLLOUTS = "reward"  # the reward service reads `rollouts`
    SCORED = "learner"  # the learner reads `scored`
