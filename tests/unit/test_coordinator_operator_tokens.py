"""RL_OPERATOR_TOKENS, the coordinator's provisioned join credentials (services/coordinator/settings.py): it stands
in for RL_JOIN_TOKEN, its tokens are checked for form without a value ever reaching an error or the log, and with
it alone the coordinator keeps no shared token anybody holds (services/coordinator/__main__.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.coordinator.settings import CoordinatorSettings
from shared.service_entry import describe_settings

ADMIN = "admin-token-0123456789"
TOKEN = "op-0123456789ab.compose-workers-xyzzy-0123456789"
OTHER_TOKEN = "op-ba9876543210.helm-workers-xyzzy-0123456789"


@pytest.fixture(autouse=True)
def no_inherited_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RL_JOIN_TOKEN", "RL_OPERATOR_TOKENS", "RL_OPEN_REGISTRATION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RL_ADMIN_TOKEN", ADMIN)


def test_operator_tokens_stand_in_for_the_shared_join_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RL_OPERATOR_TOKENS", f" {TOKEN}, {OTHER_TOKEN},")
    settings = CoordinatorSettings()
    assert settings.join_token is None and settings.operator_token_values() == [TOKEN, OTHER_TOKEN]
    assert "xyzzy" not in describe_settings(settings)  # logged at start


def test_without_a_shared_token_or_operator_tokens_the_coordinator_does_not_start() -> None:
    with pytest.raises(ValidationError, match="RL_JOIN_TOKEN or RL_OPERATOR_TOKENS is required"):
        CoordinatorSettings()


@pytest.mark.parametrize("value", [f"{TOKEN},op-0123456789ab.short", " , "])
def test_a_malformed_list_is_refused_by_position_not_value(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("RL_OPERATOR_TOKENS", value)
    with pytest.raises(ValidationError, match="RL_OPERATOR_TOKENS") as refused:
        CoordinatorSettings()
    assert "xyzzy" not in str(refused.value) and "short" not in str(refused.value)
