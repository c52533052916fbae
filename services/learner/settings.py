"""Learner settings: RL_* environment variables (the shared ones are in shared.config.ServiceSettings)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from shared.config import ModelConfig, ServiceSettings, resolve_model_dir
from shared.signing import Ed25519PrivateKey, load_signing_key
from shared.stream_trim import TRIM_INTERVAL_S


class LearnerSettings(ServiceSettings):
    model_config = SettingsConfigDict(hide_input_in_errors=True)  # a malformed RL_SIGNING_KEY stays out of the log

    model_dir: Path | None = Field(
        None,
        description="the initial HF policy folder; default [model] path, else <run_dir>/model (built there with [model] init)",
    )
    signing_key: SecretStr = Field(
        description="the Ed25519 private key that signs weight manifests, hex of 32 bytes "
        "(`python -m shared.signing generate`); only the learner holds it (required, no default)"
    )
    learner_host: str = Field("127.0.0.1", description="interface the chunk server binds")
    learner_port: int = Field(8100, ge=0, le=65535, description="chunk server port (0: any free port)")
    learner_public_url: str | None = Field(
        None, description="how workers reach the chunk server; default http://<host>:<port>"
    )
    scored_block_ms: int = Field(500, ge=1, le=5000, description="XREADGROUP BLOCK on `scored`")
    trim_interval_s: float = Field(
        TRIM_INTERVAL_S, gt=0, description="how often the consumed entries of `scored` are trimmed"
    )
    torch_num_threads: int = Field(1, ge=1, description="intra-op threads of the learner")

    @field_validator("signing_key")
    @classmethod
    def _loadable(cls, value: SecretStr) -> SecretStr:
        load_signing_key(value.get_secret_value())  # ValueError (without the key) when malformed
        return value

    def private_key(self) -> Ed25519PrivateKey:
        return load_signing_key(self.signing_key.get_secret_value())

    def resolved_model_dir(self, model: ModelConfig) -> Path:
        return resolve_model_dir(self.model_dir, model, self.run_dir)

    def resolved_public_url(self, bound_port: int) -> str:
        """The URL put in announcements; `bound_port` is the port actually bound (matters for port 0)."""
        if self.learner_public_url:
            return self.learner_public_url.rstrip("/")
        return f"http://{self.learner_host}:{bound_port}"
