"""The record one cell of `make bench-vs-trl` writes: benchmarks/results/vs_trl/cells/<cell>_seed<k>.json.

Producers: benchmarks/trl_grpo.py (the TRL cell, in .venv-trl) and benchmarks/vs_trl.py (our cells, from
the run's metrics.jsonl). Consumer: benchmarks/vs_trl_summary.py (table, summary.json, plot). Pydantic and
the standard library only: both environments import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CellName = Literal["trl", "pull", "async_s2", "async_s2_all"]
CELL_NAMES: tuple[CellName, ...] = ("trl", "pull", "async_s2", "async_s2_all")


class EvalPoint(BaseModel):
    """One held-out evaluation: greedy decoding of the task's eval set, scored by task.score."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int = Field(ge=0, description="optimizer steps taken when the weights were evaluated (0: the start)")
    num_samples: int = Field(ge=0, description="completions generated up to that step (trained + dropped)")
    wall_s: float = Field(ge=0, description="training wall time up to that step (see CellRecord.clock)")
    accuracy: float = Field(ge=0, le=1, description="fraction of held-out prompts whose greedy completion scored 1.0")


class StepPoint(BaseModel):
    """One optimizer step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int = Field(ge=1)
    num_samples: int = Field(
        ge=0,
        description="completions generated up to and including this step: trained, plus those of dropped groups "
        "(ours: stale, or skipped as flat by dynamic sampling)",
    )
    num_trained_samples: int = Field(ge=0, description="completions trained on up to and including this step")
    wall_s: float = Field(ge=0, description="training wall time at the end of this step")
    reward_mean: float = Field(description="mean task reward of the step's completions")


class CellRecord(BaseModel):
    """What one (cell, seed) run measured."""

    model_config = ConfigDict(extra="forbid")

    cell: CellName
    seed: int
    system: Literal["trl", "ours"]
    run_file: str = Field(description="the cell's run file (benchmarks/vs_trl.py wrote it from --config)")
    model_dir: str
    samples_per_step: int = Field(ge=1, description="group_size x groups_per_step")
    num_eval_prompts: int = Field(ge=1)
    clock: str = Field(description="what wall_s counts, in words (it differs between the systems: docs/vs_trl.md)")
    evals: list[EvalPoint]
    steps: list[StepPoint]
    num_dropped_groups: int = Field(
        0, ge=0, description="groups generated but never trained (ours: stale, or flat under dynamic sampling)"
    )
    eval_s: float = Field(0.0, ge=0, description="time spent evaluating (TRL: excluded from wall_s)")
    total_s: float = Field(ge=0, description="the cell's whole time, start-up and evaluation included")
    versions: dict[str, str] = Field(default_factory=dict, description="library versions the cell ran with")
    notes: list[str] = Field(default_factory=list, description="run-file settings this system could not follow")

    @property
    def key(self) -> str:
        return cell_key(self.cell, self.seed)


def cell_key(cell: str, seed: int) -> str:
    return f"{cell}_seed{seed}"


def cell_path(out_dir: Path, cell: str, seed: int) -> Path:
    return out_dir / "cells" / f"{cell_key(cell, seed)}.json"


def save_record(record: CellRecord, out_dir: Path) -> Path:
    path = cell_path(out_dir, record.cell, record.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record.model_dump_json(indent=1) + "\n")
    return path


def load_records(out_dir: Path) -> list[CellRecord]:
    """Every cell file under out_dir/cells, sorted by file name."""
    return [
        CellRecord.model_validate_json(path.read_text()) for path in sorted((out_dir / "cells").glob("*_seed*.json"))
    ]
