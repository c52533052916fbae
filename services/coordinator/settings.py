"""Where the coordinator listens and its secrets; everything else comes from `ServiceSettings`."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from shared.config import ServiceSettings
from shared.signing import KEY_HEX_PATTERN


class CoordinatorSettings(ServiceSettings):
    """Read from `RL_*` environment variables. `RL_ADMIN_TOKEN` is a required secret: no default.
    Who may join: `RL_JOIN_TOKEN` (one shared token: the local demo), `RL_OPERATOR_TOKENS` (credentials made
    outside and provisioned at start: compose, Helm), or both; one of them is required unless
    `RL_OPEN_REGISTRATION=true` says anyone may join (dev only)."""

    # populate_by_name: code and tests may pass host=..., the environment uses the RL_COORDINATOR_* names;
    # hide_input_in_errors: a model validator's error would otherwise print the environment, tokens and all
    model_config = SettingsConfigDict(
        env_prefix="RL_", extra="ignore", populate_by_name=True, hide_input_in_errors=True
    )

    host: str = Field("127.0.0.1", validation_alias="RL_COORDINATOR_HOST", description="interface to bind")
    port: int = Field(8000, ge=1, le=65535, validation_alias="RL_COORDINATOR_PORT", description="TCP port to bind")
    admin_token: SecretStr = Field(
        min_length=16, validation_alias="RL_ADMIN_TOKEN", description="bearer token of admin calls (deregister others)"
    )
    join_token: SecretStr | None = Field(
        None,
        min_length=16,
        validation_alias="RL_JOIN_TOKEN",
        description="the cluster's shared join token: every holder registers as one credential (the local demo); "
        "None: only issued and provisioned credentials register (or anyone, under open_registration)",
    )
    operator_tokens: SecretStr | None = Field(
        None,
        validation_alias="RL_OPERATOR_TOKENS",
        description="comma-separated join credentials (op-<12 hex>.<secret>) made outside the coordinator, each "
        "made sure to exist at start as if issued (services/coordinator/operators.py provision)",
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
    # TLS (docs/operations.md#tls): workers send tokens to this port, so anything but loopback serves https
    tls_cert_file: Path | None = Field(
        None,
        validation_alias="RL_TLS_CERT_FILE",
        description="the server certificate (PEM, its chain after it): set with RL_TLS_KEY_FILE, the API is served "
        "over https only (relay-rl keys --tls-host makes a run CA and one); None: plain http",
    )
    tls_key_file: Path | None = Field(
        None, validation_alias="RL_TLS_KEY_FILE", description="the server certificate's private key (PEM)"
    )

    @model_validator(mode="after")
    def _join_token_unless_open(self) -> CoordinatorSettings:
        if self.join_token is None and self.operator_tokens is None and not self.open_registration:
            raise ValueError(
                "RL_JOIN_TOKEN or RL_OPERATOR_TOKENS is required (or set RL_OPEN_REGISTRATION=true for an open dev "
                "cluster)"
            )
        return self

    @model_validator(mode="after")
    def _tls_files_together(self) -> CoordinatorSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("RL_TLS_CERT_FILE and RL_TLS_KEY_FILE go together: set both (https) or neither (http)")
        return self

    @model_validator(mode="after")
    def _operator_tokens_well_formed(self) -> CoordinatorSettings:
        if self.operator_tokens is None:
            return self
        from services.coordinator.operators import PROVISIONED_TOKEN_PATTERN  # redis and the registry: only when set

        tokens = self.operator_token_values()
        if not tokens:
            raise ValueError("RL_OPERATOR_TOKENS is set but names no token")
        # the position, never the value: the message goes to the log
        malformed = [str(i) for i, token in enumerate(tokens) if not re.fullmatch(PROVISIONED_TOKEN_PATTERN, token)]
        if malformed:
            raise ValueError(
                f"RL_OPERATOR_TOKENS: token(s) {', '.join(malformed)} (from 0) are not op-<12 hex>.<16+ URL-safe "
                "characters> (relay-rl keys --compose and deploy/make_secrets.py make them)"
            )
        return self

    def join_token_value(self) -> str | None:
        """The shared join token, or None when there is none."""
        return None if self.join_token is None else self.join_token.get_secret_value()

    def operator_token_values(self) -> list[str]:
        """RL_OPERATOR_TOKENS as a list, in order (empty when unset)."""
        if self.operator_tokens is None:
            return []
        return [token.strip() for token in self.operator_tokens.get_secret_value().split(",") if token.strip()]
