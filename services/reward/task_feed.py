"""The data plane's producer side: keep the `tasks` stream shallow.

Backpressure: the number of groups somewhere in the pipeline (tasks not finished by a worker,
rollouts not finished by this service, scored groups the learner has not read yet) is held at
`max_groups_in_flight` (default groups_per_step * max(1, S - 1), see RunConfig.max_groups_in_flight):
enough to keep the learner's next batch in the making, never so much that groups wait long enough
to go stale. A group the learner drops (stale, or flat under `[grpo] dynamic_sampling`) is read and
acked at once, so it leaves the count when it is decided and the next top-up replaces it.

Under dynamic sampling the window counts the groups the learner will train: it is divided by the share
of the last KEPT_SHARE_STEPS steps' worth of scored groups that were not flat (`KeptShare`, at least
MIN_KEPT_SHARE), so a run that skips 3 groups in 4 keeps 4x the window in flight and its workers do not
run dry while the flat groups wait to be read. The groups it will train stay about the base window, so
staleness is as without skips. The window in force is written to RunKeys.feed_window, where the
coordinator splits it among credentials. Tasks leased by identities still earning their lease allowance
(RunKeys.work_speculative, kept by the coordinator's work API: services/coordinator/work_scripts.py) are
not counted: the window is what the proven fleet can work on, so leases that an unproven identity holds
and may never answer (a Sybil's) are issued again beside it rather than out of it. (Not in pull mode, which
issues exactly the learner's batch: there an unanswered lease is reissued after its lease time.)

Pull mode (`[schedule] mode = "pull"`, Echo's sequential baseline): nothing is sampled ahead. The
learner publishes version t, then asks for its batch (a BatchRequest: the groups it still needs,
rewritten as its batch fills); the feed issues at most groups_per_step tasks per version (plus one per
group that dynamic sampling skipped as flat, which the request counts), each tagged
`min_policy_version = t`, and a worker samples a tagged task only with weights at least that new.
Every group is then on-policy when it is trained and nothing is generated to be dropped. A group lost
on the way (dead-lettered) leaves the request unmet with nothing in flight: once that has lasted
`reissue_after_s` with the request unchanged, the feed issues the missing groups again.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import deque
from dataclasses import dataclass

from shared.bus import StreamBus
from shared.config import RunConfig
from shared.flat_groups import is_flat
from shared.keys import TASKS_ISSUED, RunKeys
from shared.messages import BatchRequest, EnvironmentSpec, ScoredGroup, TaskGroup
from shared.streams import BATCH_REQUEST, ROLLOUTS, SCORED, TASKS
from shared.tasks import TaskAdapter
from shared.tasks.environment import EnvironmentTask

REISSUE_AFTER_S = 2.0  # an unmet request with nothing in flight for this long lost groups on the way
KEPT_SHARE_STEPS = 4  # the kept share is measured over this many steps' worth of the latest scored groups
# the window grows at most 8x: a run that skips more has (nearly) nothing to learn from, and the learner warns
MIN_KEPT_SHARE = 0.125


def groups_in_flight(bus: StreamBus) -> int:
    """Groups produced but not yet read by the learner, leaving out the tasks held speculatively."""
    tasks_lag, tasks_pending = bus.group_progress(TASKS)
    rollouts_lag, rollouts_pending = bus.group_progress(ROLLOUTS)
    scored_lag, _ = bus.group_progress(SCORED)  # pending there = trained, awaiting checkpoint
    in_flight = tasks_lag + tasks_pending + rollouts_lag + rollouts_pending + scored_lag
    return max(0, in_flight - speculative_leases(bus))


def speculative_leases(bus: StreamBus) -> int:
    """Tasks leased by identities still earning their allowance (the coordinator's work API keeps the set)."""
    return int(bus.redis.scard(bus.keys.work_speculative))


class KeptShare:
    """The share of the latest `num_groups` scored groups that were not flat (1.0 before the first)."""

    def __init__(self, num_groups: int) -> None:
        self._kept: deque[bool] = deque(maxlen=num_groups)

    def observe(self, rewards: list[float]) -> None:
        self._kept.append(not is_flat(rewards))

    @property
    def fraction(self) -> float:
        return sum(self._kept) / len(self._kept) if self._kept else 1.0


@dataclass
class _Issued:
    policy_version: int = -1
    num_groups: int = 0
    stuck_since_s: float | None = None  # the request unmet with nothing in flight, since (monotonic)
    stuck_request_at_s: float = 0.0  # which request that was (its requested_at_s)


class TaskFeed:
    """Publishes TaskGroups for the reward service's loop (`top_up`), in the run's schedule mode."""

    def __init__(self, bus: StreamBus, keys: RunKeys, task: TaskAdapter, run: RunConfig, reference_ttl_s: int) -> None:
        self.bus = bus
        self.keys = keys
        self.task = task
        self.run = run
        self.reference_ttl_s = reference_ttl_s
        self.reissue_after_s = REISSUE_AFTER_S
        self._issued = _Issued()
        self.kept = KeptShare(KEPT_SHARE_STEPS * run.grpo.groups_per_step)
        self._window_written: int | None = None

    def top_up(self) -> int:
        """Publish the tasks the pipeline lacks now; returns how many."""
        if self.run.schedule.mode == "pull":
            return self._answer_request()
        num_missing = self.window() - groups_in_flight(self.bus)
        return self.publish(num_missing, min_policy_version=0)

    def observe(self, scored: list[ScoredGroup]) -> None:
        """Scored groups tell the feed how many the learner will skip as flat."""
        for group in scored:
            self.kept.observe(group.rewards)

    def window(self) -> int:
        """The groups kept in flight now: max_groups_in_flight, over the kept share under dynamic sampling
        (module doc); written to RunKeys.feed_window when it changes."""
        window = self.run.max_groups_in_flight
        if self.run.grpo.dynamic_sampling:
            window = math.ceil(window / max(self.kept.fraction, MIN_KEPT_SHARE))
        if window != self._window_written:
            self.bus.redis.set(self.keys.feed_window, window)
            self._window_written = window
        return window

    def publish(self, num_tasks: int, min_policy_version: int) -> int:
        for _ in range(max(0, num_tasks)):
            prompt = self.task.sample_prompt()
            message = TaskGroup(
                run_id=self.run.run_id,
                task_id=uuid.uuid4().hex,
                task_name=self.task.name,
                prompt=prompt.prompt,
                messages=list(prompt.messages),
                num_samples=self.run.grpo.group_size,
                max_new_tokens=self.run.grpo.max_new_tokens,
                temperature=self.run.grpo.temperature,
                min_policy_version=min_policy_version,
                # multi-turn: workers play the episode from the prompt's state (no secret: the reward is the replay's)
                environment=EnvironmentSpec(state=prompt.reference, max_turns=self.task.max_turns)
                if isinstance(self.task, EnvironmentTask)
                else None,
            )
            # The reference is stored before the task exists, so a rollout can always be scored; with it
            # a raw-text prompt, which the prompt ids of its rollouts must encode (chat prompts: not checked).
            writes = self.bus.redis.pipeline(transaction=False)
            writes.set(self.keys.task_reference(message.task_id), prompt.reference.encode(), ex=self.reference_ttl_s)
            if not prompt.messages:
                writes.set(self.keys.task_prompt(message.task_id), prompt.prompt.encode(), ex=self.reference_ttl_s)
            writes.execute()
            self.bus.publish(TASKS, message, tally=(self.keys.reward_counts, TASKS_ISSUED))  # counted with its XADD
        return max(0, num_tasks)

    def _answer_request(self) -> int:
        request = self.bus.get_state(BATCH_REQUEST)
        if request is None or request.run_id != self.run.run_id or request.num_groups_wanted == 0:
            return 0
        issued = self._issued
        if request.policy_version != issued.policy_version:
            self._issued = issued = _Issued(policy_version=request.policy_version)
        in_flight = groups_in_flight(self.bus)
        # never more than one batch per version (plus the groups dynamic sampling skipped, to replace them):
        # a request read a moment before the learner rewrote it (it has just read groups that were in
        # flight) would otherwise ask for them twice
        num_allowed = self.run.grpo.groups_per_step + request.num_groups_skipped - issued.num_groups
        num_missing = min(request.num_groups_wanted - in_flight, num_allowed)
        if in_flight > 0:
            issued.stuck_since_s = None
        elif num_missing <= 0 and self._stuck(request):
            num_missing = request.num_groups_wanted  # lost on the way (module docstring)
        num_published = self.publish(num_missing, min_policy_version=request.policy_version)
        issued.num_groups += num_published
        return num_published

    def _stuck(self, request: BatchRequest) -> bool:
        """True when this same unmet request has had nothing in flight for reissue_after_s."""
        issued, now_s = self._issued, time.monotonic()
        if issued.stuck_since_s is None or issued.stuck_request_at_s != request.requested_at_s:
            issued.stuck_since_s, issued.stuck_request_at_s = now_s, request.requested_at_s
            return False
        if now_s - issued.stuck_since_s < self.reissue_after_s:
            return False
        issued.stuck_since_s = None
        return True
