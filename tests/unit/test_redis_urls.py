"""Credential stripping of Redis URLs (shared/redis_urls.py): a password hides in the query as well as in
the user info, and redis-py logs in with either."""

from __future__ import annotations

import pytest
import redis

from shared.redis_urls import is_credential_parameter, with_credentials, without_credentials

BASE = "rediss://redis.example.org:6380/2?ssl_ca_certs=%2Fetc%2Fca.pem&ssl_cert_reqs=required"


@pytest.mark.parametrize(
    "query",
    [
        "password=hunter2",
        "PASSWORD=hunter2",
        "pass%77ord=hunter2",  # percent-encoded name: still "password" to redis-py
        "ssl_password=keyfile-secret",
        "username=admin",
        "password=hunter2&username=admin&ssl_password=x",
    ],
)
def test_credential_query_parameters_are_stripped_and_the_others_kept_as_written(query: str) -> None:
    url = f"{BASE}&{query}"
    stripped = without_credentials(url)
    assert stripped == BASE
    kwargs = redis.ConnectionPool.from_url(stripped).connection_kwargs
    assert "password" not in kwargs and "username" not in kwargs and "ssl_password" not in kwargs
    assert kwargs["ssl_ca_certs"] == "/etc/ca.pem"


def test_redis_py_would_log_in_with_a_query_password_which_is_why_it_goes() -> None:
    assert (
        redis.ConnectionPool.from_url("redis://127.0.0.1:6379/0?password=hunter2").connection_kwargs["password"]
        == "hunter2"
    )
    assert without_credentials("redis://u:pw@127.0.0.1:6379/0?password=hunter2") == "redis://127.0.0.1:6379/0"


def test_with_credentials_replaces_every_credential_the_url_carried() -> None:
    url = with_credentials("redis://old:pw@127.0.0.1:6379/0?password=old&socket_timeout=5", "reward", "new")
    assert url == "redis://reward:new@127.0.0.1:6379/0?socket_timeout=5"
    kwargs = redis.ConnectionPool.from_url(url).connection_kwargs
    assert (kwargs["username"], kwargs["password"]) == ("reward", "new")


def test_only_names_that_carry_a_credential_are_matched() -> None:
    assert not any(
        map(is_credential_parameter, ["ssl_ca_certs", "ssl_cert_reqs", "socket_timeout", "db", "ssl_keyfile"])
    )
    assert all(map(is_credential_parameter, ["password", "ssl_password", "auth_token", "username", "Secret"]))
