"""What the operator's tools (`relay-rl worker`, `status`, `operators`, `model`, `python -m cluster.accounting`,
`python -m cluster.redis_acl`) read
from the environment: the same `RL_*` names the services read, as one settings class, so each tool's flag
defaults come from here and no tool reads the environment itself.

Every field is optional: a tool says what it needs when a flag and its variable are both missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict


class ToolSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RL_", extra="ignore", env_ignore_empty=True, hide_input_in_errors=True
    )

    coordinator_url: str | None = Field(None, description="the coordinator's base URL")
    admin_token: SecretStr | None = Field(None, description="the coordinator's admin bearer token")
    join_token: SecretStr | None = Field(None, description="a join credential, or the cluster's shared join token")
    redis_url: str | None = Field(None, description="an operator's Redis URL (reads every stream)")
    coordinator_ca_file: Path | None = Field(None, description="the run CA the coordinator's certificate chains to")
    coordinator_cert_sha256: str | None = Field(None, description="the coordinator certificate's SHA-256 pin")
    insecure_http: bool = Field(False, description="allow a plain http:// coordinator that is not on loopback")
    weights_public_key: str | None = Field(None, description="the learner's Ed25519 public key (hex)")
    model_cache: Path | None = Field(None, description="where catalog models are cached (relay-rl model get)")
    # each trusted service's Redis password and the operator's (python -m cluster.redis_acl writes the ACL file)
    redis_password_coordinator: SecretStr | None = None
    redis_password_reward: SecretStr | None = None
    redis_password_learner: SecretStr | None = None
    redis_password_operator: SecretStr | None = None

    def redis_password(self, user: str) -> str | None:
        """The password of Redis user `user` (coordinator, reward, learner, operator); None when unset."""
        secret: SecretStr | None = getattr(self, f"redis_password_{user}")
        return None if secret is None else secret.get_secret_value()

    def admin_token_value(self) -> str | None:
        return None if self.admin_token is None else self.admin_token.get_secret_value()

    def join_token_value(self) -> str | None:
        return None if self.join_token is None else self.join_token.get_secret_value()


def tool_settings(tool: str) -> ToolSettings:
    """The environment's settings for `tool`; a malformed variable exits with its name (never its value)."""
    try:
        return ToolSettings()
    except ValidationError as exc:
        names = ", ".join(f"RL_{str(error['loc'][0]).upper()}" for error in exc.errors())
        sys.exit(f"{tool}: malformed environment variable(s): {names}")
