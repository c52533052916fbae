"""Where the coordinator listens and its secrets; everything else comes from `ServiceSettings`."""

from __future__ import annotations

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from shared.config import ServiceSettings
from shared.signing import KEY_HEX_PATTERN


class CoordinatorSettings(ServiceSettings):
    """Read from `RL_*` environment variables. `RL_ADMIN_TOKEN` is a required secret: no default.
    `RL_JOIN_TOKEN` is required too, unless `RL_OPEN_REGISTRATION=true` says anyone may join (dev only)."""

    # populate_by_name: code and tests may pass host=..., the environment uses the RL_COORDINATOR_* names
    model_config = SettingsConfigDict(env_prefix="RL_", extra="ignore", populate_by_name=True)

    host: str = Field("127.0.0.1", validation_alias="RL_COORDINATOR_HOST", description="interface to bind")
    port: int = Field(8000, ge=1, le=65535, validation_alias="RL_COORDINATOR_PORT", description="TCP port to bind")
    admin_token: SecretStr = Field(
        min_length=16, validation_alias="RL_ADMIN_TOKEN", description="bearer token of admin calls (deregister others)"
    )
    join_token: SecretStr | None = Field(
        None,
        min_length=16,
        validation_alias="RL_JOIN_TOKEN",
        description="secret a worker sends (header X-RL-Join-Token) to register; required unless open_registration",
    )
    open_registration: bool = Field(
        False,
        validation_alias="RL_OPEN_REGISTRATION",
        description="dev only: anyone who reaches the coordinator may register (no join token)",
    )

    redis_acl: bool = Field(
        False,
        validation_alias="RL_REDIS_ACL",
        description="true: give each worker its own Redis ACL user at registration (the coordinator's Redis user "
        "needs +acl and +client|kill); false: workers use their own RL_REDIS_URL (embedded dev mode, bare Redis)",
    )
    worker_redis_url: str | None = Field(
        None,
        validation_alias="RL_WORKER_REDIS_URL",
        description="the Redis URL workers are told to use, without credentials (redis:// or rediss://); "
        "default: their own RL_REDIS_URL",
    )
    weights_public_key: str | None = Field(
        None,
        pattern=KEY_HEX_PATTERN,
        validation_alias="RL_WEIGHTS_PUBLIC_KEY",
        description="the learner's Ed25519 public key, handed to workers at GET /v1/cluster/bootstrap "
        "(None: no bootstrap; workers need RL_WEIGHTS_PUBLIC_KEY and the run file of their own)",
    )
    rollout_key_retention_s: int = Field(
        86_400,
        ge=1,
        validation_alias="RL_ROLLOUT_KEY_RETENTION_S",
        description="how long a departed worker's rollout-signing key is kept (its groups in flight still verify)",
    )
    drain_grace_s: float = Field(
        300.0,
        gt=0,
        validation_alias="RL_DRAIN_GRACE_S",
        description="with RL_REDIS_ACL: a worker draining this long loses its Redis user even if it still heartbeats",
    )

    @model_validator(mode="after")
    def _join_token_unless_open(self) -> CoordinatorSettings:
        if self.join_token is None and not self.open_registration:
            raise ValueError("RL_JOIN_TOKEN is required (or set RL_OPEN_REGISTRATION=true for an open dev cluster)")
        return self

    def join_token_value(self) -> str | None:
        """The join token, or None when registration is open."""
        return None if self.join_token is None else self.join_token.get_secret_value()
