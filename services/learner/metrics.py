"""Writing the learner's records: metrics.jsonl (a StepRecord after every optimizer step, an EvalRecord for
the evaluations of step 0, every eval_every steps and the end, appended by the eval thread when each
finishes; a skipped one writes none) and learner_summary.json (a LearnerSummary when the learner stops).
The record classes are the contract with the tooling and live in shared/run_records.py.

After a crash the learner resumes from its checkpoint at version t and rewrites metrics.jsonl without
the lines past t (those steps are taken again), so the file always describes one history.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from shared.run_records import EvalRecord, LearnerSummary, StepRecord


class MetricsLog:
    """Appends records to metrics.jsonl, one flushed line each (safe to tail while the run goes). The
    training loop and the eval thread both append: a lock keeps their lines whole."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: StepRecord | EvalRecord) -> None:
        line = record.model_dump_json() + "\n"
        with self._lock, open(self.path, "a") as f:
            f.write(line)

    def truncate_after(self, policy_version: int) -> int:
        """Drop lines about versions past `policy_version` (taken again after a resume); returns how many."""
        if not self.path.exists():
            return 0
        kept, num_dropped = [], 0
        for line in self.path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line torn by the crash itself
                num_dropped += 1
                continue
            if record.get("step", record.get("eval_step", 0)) > policy_version:
                num_dropped += 1
                continue
            kept.append(line)
        tmp_path = self.path.with_suffix(".jsonl.tmp")
        tmp_path.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp_path, self.path)
        return num_dropped


def write_summary(path: Path, summary: LearnerSummary) -> None:
    tmp_path = path.with_suffix(".json.tmp")
    tmp_path.write_text(summary.model_dump_json(indent=2) + "\n")
    os.replace(tmp_path, path)
