"""Reward service settings: RL_* environment variables (see shared.config.ServiceSettings)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from shared.config import ModelConfig, ServiceSettings, resolve_model_dir
from shared.stream_trim import TRIM_INTERVAL_S


class RewardSettings(ServiceSettings):
    consumer_name: str = Field("reward-0", description="this instance's consumer name in the group")
    claim_idle_ms: int = Field(15000, ge=100, description="take over rollouts pending this long")
    trim_interval_s: float = Field(
        TRIM_INTERVAL_S,
        gt=0,
        description="how often the consumed entries of `tasks` and `rollouts` are trimmed",
    )
    model_dir: Path | None = Field(
        None,
        description="the policy folder whose tokenizer.json decodes the token ids "
        "(default: the run file's [model] path, else <run_dir>/model)",
    )

    def resolved_model_dir(self, model: ModelConfig) -> Path:
        return resolve_model_dir(self.model_dir, model, self.run_dir)
