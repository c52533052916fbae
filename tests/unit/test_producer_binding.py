"""Rollout signing (shared/rollout_mac.py), the Redis URLs the runner and the workers build
(shared/redis_urls.py, rediss:// included), the worker's ACL rules and the runner's ACL file."""

from __future__ import annotations

import uuid

import pytest
import redis

from cluster.redis_acl import RedisUsers
from shared.messages import RolloutGroup, pack_float32, pack_int32
from shared.redis_urls import with_credentials, without_credentials
from shared.rollout_mac import mac_matches, new_rollout_key, rollout_mac, sign_rollout
from shared.service_entry import redact_url_password

TLS_URL = "rediss://redis.example.org:6380/2?ssl_ca_certs=%2Fetc%2Fca.pem&ssl_cert_reqs=required"


def group(**fields: object) -> RolloutGroup:
    values: dict[str, object] = dict(
        run_id="r",
        group_id=uuid.uuid4().hex,
        task_id="t",
        task_name="arithmetic_mod10",
        prompt="1+2=",
        worker_id="w-a",
        policy_version=3,
        temperature=1.0,
        prompt_token_ids=pack_int32([1, 2]),
        completion_token_ids=pack_int32([5, 6]),
        completion_lengths=pack_int32([1, 1]),
        behaviour_logprobs=pack_float32([-0.5, -1.5]),
        completion_texts=["3", "4"],
        finish_reasons=["stop", "length"],
        generation_s=0.25,
    )
    return RolloutGroup.model_validate({**values, **fields})


def test_a_signed_group_verifies_after_the_wire_and_nothing_else_does() -> None:
    key = new_rollout_key()
    signed = sign_rollout(group(), key)
    assert len(signed.producer_mac) == 32
    assert mac_matches(RolloutGroup.decode(signed.encode()), key)  # survives msgpack both ways
    assert not mac_matches(signed, new_rollout_key())  # another worker's key
    assert not mac_matches(signed.model_copy(update={"worker_id": "w-b"}), key)  # another id
    assert not mac_matches(signed.model_copy(update={"completion_token_ids": pack_int32([5, 7])}), key)
    assert not mac_matches(group(), key)  # unsigned
    assert rollout_mac(signed, key) == signed.producer_mac  # the mac never covers itself


def test_a_mac_longer_than_sha256_is_refused_at_decoding() -> None:
    with pytest.raises(ValueError):
        group(producer_mac=b"x" * 33)


def test_credentials_go_into_and_out_of_a_rediss_url_keeping_its_tls_parameters() -> None:
    with_user = with_credentials(TLS_URL, "rl:run:worker:w-1", "p@ss/word")
    assert with_user.startswith("rediss://rl%3Arun%3Aworker%3Aw-1:p%40ss%2Fword@redis.example.org:6380/2?")
    assert without_credentials(with_user) == TLS_URL
    assert (
        redact_url_password(with_user)
        == "rediss://rl%3Arun%3Aworker%3Aw-1:***@redis.example.org:6380/2?" + (TLS_URL.split("?")[1])
    )
    pool = redis.ConnectionPool.from_url(with_user)  # what redis-py makes of it: TLS, the user, the CA file
    assert pool.connection_class is redis.SSLConnection
    kwargs = pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"]) == ("rl:run:worker:w-1", "p@ss/word")
    assert kwargs["ssl_ca_certs"] == "/etc/ca.pem" and kwargs["db"] == 2


def test_credentials_replace_those_already_in_the_url() -> None:
    assert with_credentials("redis://old:pw@127.0.0.1:6379/0", "reward", "new") == "redis://reward:new@127.0.0.1:6379/0"
    assert without_credentials("redis://[::1]:6379/0") == "redis://[::1]:6379/0"


def test_the_acl_file_disables_the_default_user_and_holds_no_password() -> None:
    users = RedisUsers("run-1")
    text = users.acl_file_text()
    assert text.splitlines()[0].startswith("user default off")
    assert not any(password in text for password in users.passwords.values())
    coordinator = next(line for line in text.splitlines() if line.startswith("user coordinator "))
    assert "~rl:run-1:*" in coordinator and "-@dangerous" in coordinator
    assert not any("+acl" in line or "+client" in line for line in text.splitlines())  # nobody manages users
