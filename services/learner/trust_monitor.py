"""The learner's side of trust, in three calls from its loop (docs/trust.md):

    on_publish            remember the published version's weights for spot audits
    refresh_quarantine    read the coordinator's QUARANTINE key: the collector drops those workers' groups,
                          and those of the learner's own suspects (reason `quarantined`); a worker an admin
                          released starts over at score 0
    observe_step          measure this step's bf16 reference (numerics.py: the exact checks' tolerance), then
                          per trained group: the statistic, an exact check when possible, the score;
                          one GroupTrustRecord per group in trust.jsonl

`trust_by_worker()` goes into LearnerState, where the coordinator reads who is suspect.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import torch

from services.learner.audit import Auditor
from services.learner.batch import AdmittedGroup, BatchCollector, TrainBatch
from services.learner.numerics import NumericsReference
from services.learner.trust import TrustTracker, group_statistics
from shared.bus import StreamBus
from shared.config import TrustConfig
from shared.messages import WorkerTrust
from shared.retry import call_with_retry
from shared.run_records import GroupTrustRecord
from shared.streams import QUARANTINE

log = logging.getLogger(__name__)


class TrustMonitor:
    def __init__(
        self,
        config: TrustConfig,
        model: torch.nn.Module,
        bus: StreamBus,
        journal_path: Path,
        compute: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        """compute: the learner's compute context (precision.py), entered around every audit forward so an
        audit's pi_v is computed as pi_prox is."""
        self.config = config
        self.bus = bus
        self.tracker = TrustTracker(config)
        self.auditor = Auditor(model, config, compute=compute)
        self.numerics = NumericsReference(config)
        self.journal_path = journal_path
        self.audit_s_total = 0.0
        self.num_spot_audits = 0

    def on_publish(self, version: int, model: torch.nn.Module) -> None:
        if self.config.enabled:
            self.auditor.remember(version, model)

    def refresh_quarantine(self, collector: BatchCollector) -> None:
        quarantine = call_with_retry(lambda: self.bus.get_state(QUARANTINE), "read quarantine")
        for worker_id in self.tracker.apply_releases(quarantine):
            log.info("worker %s was released by an admin: its trust score starts over", worker_id)
        # the learner's own suspects too: their groups stop here without waiting for the coordinator's pass
        suspects = {worker_id for worker_id, score in self.tracker.scores.items() if score.suspect}
        collector.quarantined = frozenset(quarantine.worker_ids if quarantine is not None else ()) | suspects

    def observe_step(
        self, learner_version: int, groups: list[AdmittedGroup], tensors: TrainBatch, logprobs: torch.Tensor
    ) -> None:
        """logprobs: (B, T - 1) pi_prox of the step that trained at `learner_version`, aligned with `tensors`."""
        if not self.config.enabled:
            return
        statistics = group_statistics(groups, tensors, logprobs)
        self.numerics.measure(self.auditor.policy, tensors)  # this step's bf16 reference, before any check
        tolerance_nats = self.numerics.tolerance_nats
        checks = self.auditor.check(groups, statistics, tensors)
        lines = []
        for stat, check in zip(statistics, checks, strict=True):
            previous = self.tracker.scores.get(stat.worker_id)
            was_suspect = previous is not None and previous.suspect  # read now: observe() updates it in place
            provenance = check.provenance
            verdict = self.tracker.observe(
                stat.worker_id,
                stat.lag,
                stat.abs_diff_nats,
                check.exact_diff_nats,
                tolerance_nats,
                provenance.failed if provenance is not None else None,
            )
            if check.audit_s > 0:
                self.audit_s_total += check.audit_s
                self.num_spot_audits += 1
            if self.tracker.scores[stat.worker_id].suspect and not was_suspect:
                log.warning("worker %s is suspect: trust score %.1f", stat.worker_id, verdict.score)
            record = GroupTrustRecord(
                step=learner_version,
                worker_id=stat.worker_id,
                policy_version=stat.policy_version,
                lag=stat.lag,
                num_tokens=stat.num_tokens,
                abs_diff_nats=stat.abs_diff_nats,
                exact_diff_nats=check.exact_diff_nats,
                audit_s=check.audit_s,
                tolerance_nats=tolerance_nats,
                suspicious=verdict.suspicious,
                audit_failed=verdict.audit_failed,
                score=verdict.score,
                provenance_violations=provenance.num_violations if provenance is not None else None,
                provenance_max_gap=provenance.max_gap if provenance is not None else None,
                provenance_failed=provenance is not None and provenance.failed,
            )
            lines.append(record.model_dump_json())
        with self.journal_path.open("a") as journal:
            journal.write("".join(line + "\n" for line in lines))

    def trust_by_worker(self) -> dict[str, WorkerTrust]:
        return self.tracker.snapshot()
