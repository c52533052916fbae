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
    # connection limits (services/coordinator/http_limits.py)
    max_connections: int = Field(
        10_000,
        ge=16,
        validation_alias="RL_COORDINATOR_MAX_CONNECTIONS",
        description="connections or requests in progress at once; past it new requests get 503 (a worker holds "
        "about three: calls, work, the weights long-poll; the process needs as many file descriptors)",
    )
    request_timeout_s: float = Field(
        30.0,
        gt=0,
        validation_alias="RL_COORDINATOR_REQUEST_TIMEOUT_S",
        description="a connection must deliver a whole request (head and body) within this of opening or of its "
        "previous response, or it is closed (idle and dribbling clients)",
    )
    keep_alive_s: float = Field(
        5.0,
        gt=0,
        validation_alias="RL_COORDINATOR_KEEP_ALIVE_S",
        description="an idle keep-alive connection is closed this long after its last response",
    )

    @model_validator(mode="after")
    def _join_token_unless_open(self) -> CoordinatorSettings:
        if self.join_token is None and not self.open_registration:
            raise ValueError("RL_JOIN_TOKEN is required (or set RL_OPEN_REGISTRATION=true for an open dev cluster)")
        return self

    def join_token_value(self) -> str | None:
        """The join token, or None when registration is open."""
        return None if self.join_token is None else self.join_token.get_secret_value()
