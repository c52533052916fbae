"""Reward service settings: RL_* environment variables (see shared.config.ServiceSettings)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from shared.config import ModelConfig, ServiceSettings, resolve_model_dir
from shared.stream_trim import DEAD_LETTERS_KEPT, TRIM_INTERVAL_S


class RewardSettings(ServiceSettings):
    consumer_name: str = Field("reward-0", description="RL_CONSUMER_NAME: this instance's consumer name in the group")
    rollouts_block_ms: int = Field(
        50,
        ge=1,
        le=5000,
        description="RL_ROLLOUTS_BLOCK_MS: XREADGROUP BLOCK; short, because the task feed is topped up between reads",
    )
    claim_idle_ms: int = Field(15000, ge=100, description="RL_CLAIM_IDLE_MS: take over rollouts pending this long")
    reference_ttl_s: int = Field(3600, ge=1, description="RL_REFERENCE_TTL_S: how long a task's reference is kept")
    trim_interval_s: float = Field(
        TRIM_INTERVAL_S,
        gt=0,
        description="RL_TRIM_INTERVAL_S: how often the consumed entries of `tasks` and `rollouts` are trimmed",
    )
    dead_letters_kept: int = Field(
        DEAD_LETTERS_KEPT,
        ge=100,
        description="RL_DEAD_LETTERS_KEPT: about this many newest dead letters are kept (evidence; the "
        "accounting counts them at the source, so older ones can go)",
    )
    model_dir: Path | None = Field(
        None,
        description="RL_MODEL_DIR: the policy folder whose tokenizer.json decodes the token ids "
        "(default: the run file's [model] path, else <run_dir>/model)",
    )

    def resolved_model_dir(self, model: ModelConfig) -> Path:
        return resolve_model_dir(self.model_dir, model, self.run_dir)
