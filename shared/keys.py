"""Names of every Redis key of one run: the streams' and the learner state's from their descriptors
(shared/streams.py), the rest (task references, the coordinator's records) defined here.

All names start with `rl:<run_id>:` so runs (and tests, which use a fresh run id each) never share state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared.streams import StateKey, Stream


DEAD_LETTERED = "dead_lettered"  # RunKeys.learner_decisions: the field counting the learner's dead letters
TASKS_ISSUED = "tasks_issued"  # RunKeys.reward_counts: tasks the reward service put on `tasks`
GROUPS_SCORED = "scored"  # RunKeys.reward_counts: groups the reward service put on `scored`


@dataclass(frozen=True)
class RunKeys:
    run_id: str

    @property
    def prefix(self) -> str:
        return f"rl:{self.run_id}:"

    def name_of(self, channel: Stream[Any] | StateKey[Any]) -> str:
        """The full name of a stream or state key (shared/streams.py defines them all)."""
        return self.prefix + channel.name

    # keys
    def task_reference(self, task_id: str) -> str:
        """reward -> reward: the verifier's reference for a task, kept out of the workers' hands."""
        return self.prefix + f"task:{task_id}"

    def task_prompt(self, task_id: str) -> str:
        """reward -> reward: a raw-text task's prompt, against which a rollout's prompt ids are checked."""
        return self.prefix + f"task-prompt:{task_id}"

    @property
    def worker_ids(self) -> str:
        """coordinator: set of registered worker ids."""
        return self.prefix + "workers"

    def worker(self, worker_id: str) -> str:
        """coordinator: hash with one worker's record."""
        return self.prefix + f"worker:{worker_id}"

    def rollout_key(self, worker_id: str) -> str:
        """coordinator -> reward: the 32-byte key `worker_id` signs its rollouts with (shared/rollout_mac.py);
        issued to the worker once, at registration (services/coordinator/redis_access.py)."""
        return self.prefix + f"rollout-key:{worker_id}"

    @property
    def worker_leases(self) -> str:
        """coordinator: sorted set worker_id -> lease expiry (unix seconds); only live workers are in it."""
        return self.prefix + "leases"

    @property
    def worker_dead(self) -> str:
        """coordinator: sorted set worker_id -> unix seconds its lease ran out; only dead workers are in it (what
        pruning and the listings of dead workers read, so thousands of them cost no pass over the live ones)."""
        return self.prefix + "dead-workers"

    @property
    def broadcast_times(self) -> str:
        """coordinator: hash policy_version -> T_bcast, seconds from publication start to the (n - f)-th counted
        worker's swap (services/coordinator/broadcast_times.py)."""
        return self.prefix + "broadcast:seconds"

    @property
    def relay_plan(self) -> str:
        """coordinator: the current relay plan (who fetches weights from whom)."""
        return self.prefix + "broadcast:plan"

    def broadcast_swaps(self, policy_version: int) -> str:
        """coordinator: hash worker_id -> unix time it swapped in `policy_version` (from heartbeats)."""
        return self.prefix + f"broadcast:swaps:{policy_version}"

    def broadcast_swap_splits(self, policy_version: int) -> str:
        """coordinator: hash worker_id -> "<ready_at_s>:<pause_s>" of its swap of `policy_version` ('' unknown)."""
        return self.prefix + f"broadcast:swap-splits:{policy_version}"

    @property
    def broadcast_announced(self) -> str:
        """coordinator: hash policy_version -> unix time the learner started publishing it (T_bcast's start;
        the announcement time for a learner that does not say)."""
        return self.prefix + "broadcast:announced"

    @property
    def broadcast_published(self) -> str:
        """coordinator: hash policy_version -> unix time the learner announced it (published_at_s)."""
        return self.prefix + "broadcast:published"

    @property
    def broadcast_splits(self) -> str:
        """coordinator: hash policy_version -> "<publish_s>:<ready_s>:<pause_mean_s>:<pause_max_s>:<num_paused>"
        recorded with its T_bcast ('' unknown)."""
        return self.prefix + "broadcast:splits"

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
    def learner_decisions(self) -> str:
        """learner: hash of groups decided for good and acked at once: DropReason value -> count, plus
        "dead_lettered". Counted in Redis in the same step as the ack, so a learner killed before its
        next checkpoint loses none of them (services/learner/batch.py)."""
        return self.prefix + "learner:decisions"

    @property
    def reward_counts(self) -> str:
        """reward: hash of the data plane's counts, each written in the same transaction as what it counts:
        TASKS_ISSUED (with each XADD to `tasks`) and GROUPS_SCORED (with each XADD to `scored` and its
        rollout's ack). The accounting starts from them (cluster/accounting.py), not from stream lengths."""
        return self.prefix + "reward:counts"

    @property
    def dead_letter_counts(self) -> str:
        """any consumer (shared/bus.py): hash source stream (its name under the run prefix) -> entries of it
        dead-lettered and acked through the bus, counted in the same script as the ack (once per entry)."""
        return self.prefix + "dead:counts"

    @property
    def learner_history(self) -> str:
        """coordinator: list of JSON points (version, reward, utilization, cost) for the dashboard, newest last."""
        return self.prefix + "learner:history"

    @property
    def work_totals(self) -> str:
        """coordinator (work API, services/coordinator/work_leases.py): hash WorkCounter value -> count over
        every worker of the run; written in the same transaction as the stream operation it counts."""
        return self.prefix + "work:totals"

    def work_counts(self, worker_id: str) -> str:
        """coordinator (work API): hash WorkCounter value -> count for one worker, never deleted during the
        run (the accounting closes per worker from these, not from the streams, which are trimmed)."""
        return self.prefix + f"work:worker:{worker_id}"

    @property
    def work_worker_ids(self) -> str:
        """coordinator (work API): set of every worker id that ever leased a task or answered a lease (the
        accounting's rows)."""
        return self.prefix + "work:worker-ids"

    def work_answered(self, lease_id: str) -> str:
        """coordinator (work API): string "<worker id>:<sha256 of the answer>" of an accepted answer, kept
        ANSWERED_TTL_S: the same answer sent again (a retry whose first reply was lost) is accepted again
        without a second group or a dead letter."""
        return self.prefix + f"work:answered:{lease_id}"

    def work_release_baseline(self, worker_id: str) -> str:
        """coordinator (services/coordinator/quarantine.py release -> work_leases.py): hash WorkCounter value ->
        the worker's count when an admin last released it; its completion is judged on the leases ended since."""
        return self.prefix + f"work:released:{worker_id}"

    def worker_rewards(self, worker_id: str) -> str:
        """reward -> coordinator (shared/worker_rewards.py): hash of the groups the reward service scored for one
        worker (count, sum and sum of squares of their mean rewards), written with the scored groups."""
        return self.prefix + f"reward:worker:{worker_id}"

    @property
    def operator_ids(self) -> str:
        """coordinator: set of every join credential id issued for the run (services/coordinator/operators.py)."""
        return self.prefix + "operators"

    def operator(self, operator_id: str) -> str:
        """coordinator: hash with one join credential's record (its token only as a sha256)."""
        return self.prefix + f"operator:{operator_id}"

    def operator_quarantine(self, operator_id: str) -> str:
        """coordinator: set of the credential's quarantined worker ids; non-empty: it registers nobody."""
        return self.prefix + f"operator-quarantine:{operator_id}"

    @property
    def credential_prefix(self) -> str:
        """The prefix of every per-credential key below: `<prefix><credential id>:<part>` (the Lua scripts of
        services/coordinator/work_scripts.py build them so). The shared join token's credential id is ""."""
        return self.prefix + "credential:"

    def credential_work(self, credential_id: str) -> str:
        """coordinator (work API): hash of one credential's lease budget and record: `allowance` (earned),
        `held` (leases its identities hold now), `share` (its part of the in-flight window, set by the control
        loop), `cut_at_s`, and the WorkCounter fields plus `scored` and `rejected` summed over its identities."""
        return self.credential_prefix + f"{credential_id}:work"

    def credential_live(self, credential_id: str) -> str:
        """coordinator: set of the credential's live identities (registered, lease running): its worker cap."""
        return self.credential_prefix + f"{credential_id}:live"

    def credential_release_baseline(self, credential_id: str) -> str:
        """coordinator: the credential's record when an admin last released it; its completion is judged after."""
        return self.credential_prefix + f"{credential_id}:released"

    def credential_refusals(self, credential_id: str) -> str:
        """coordinator (work API): stream of the dead letters of the credential's refused answers, capped per
        credential (services/coordinator/work_leases.py), so no one's refusals push out another's dead letters."""
        return self.credential_prefix + f"{credential_id}:refusals"

    @property
    def work_speculative(self) -> str:
        """coordinator -> reward: set of the lease ids (task entry ids) held by identities still earning their
        allowance; the task feed issues that many tasks beyond its window (services/reward/task_feed.py)."""
        return self.prefix + "work:speculative"

    @property
    def feed_window(self) -> str:
        """reward -> coordinator: the groups the task feed keeps in flight now (services/reward/task_feed.py);
        the coordinator splits it among credentials (services/coordinator/credential_record.py)."""
        return self.prefix + "feed:window"

    # held-out evaluation by the workers (services/reward/evaluation.py; docs/evaluation.md#where-evaluation-runs)
    @property
    def evals_open(self) -> str:
        """reward: hash policy_version -> unix time its evaluation is abandoned (the versions with eval tasks out)."""
        return self.prefix + "eval:open"

    def eval_state(self, policy_version: int) -> str:
        """reward (and the work API's `first_leased_at_s`): hash of one version's open evaluation: `request_id`,
        `requested_at_s`, `deadline_at_s`, `num_prompts`, `first_leased_at_s`."""
        return self.prefix + f"eval:{policy_version}"

    def eval_prompts(self, policy_version: int) -> str:
        """reward: hash task_id -> held-out prompt index, of the version's eval tasks issued."""
        return self.prefix + f"eval:{policy_version}:prompts"

    def eval_scores(self, policy_version: int) -> str:
        """reward: hash prompt index -> its EvalScore (JSON), the first scored answer for each prompt."""
        return self.prefix + f"eval:{policy_version}:scores"
