"""What counts as a Redis outage (shared/retry.py), whichever way the error reached us: redis-py's classes,
and the same replies raised as a plain ResponseError (the heartbeat's hot path answered 500, not 503,
while Redis replayed its AOF: its own reply parser raised LOADING as a ResponseError)."""

from __future__ import annotations

import pytest
import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient

from services.coordinator.errors import install_error_handlers
from shared.retry import Backoff, as_redis_outage, call_with_retry, is_redis_outage, redis_reply_error

LOADING = "LOADING Redis is loading the dataset in memory"
OOM = "OOM command not allowed when used memory > 'maxmemory'."


@pytest.mark.parametrize(
    ("reply", "error_type"),
    [
        (LOADING, redis.exceptions.BusyLoadingError),
        (OOM, redis.exceptions.OutOfMemoryError),
        ("NOSCRIPT No matching script. Please use EVAL.", redis.exceptions.NoScriptError),
        ("ERR max number of clients reached", redis.ConnectionError),
        ("NOGROUP No such key 'tasks' or consumer group 'g'", redis.ResponseError),
    ],
)
def test_an_error_reply_gets_the_class_redis_py_gives_it(reply: str, error_type: type[Exception]) -> None:
    error = redis_reply_error(reply)
    # redis-py may name a subclass (8.2 raises MaxClientsReachedError, a ConnectionError, for max clients)
    assert isinstance(error, error_type)
    assert str(error) in reply


@pytest.mark.parametrize(
    "exc",
    [
        redis.ConnectionError("Connection refused"),
        redis.TimeoutError("Timeout reading from socket"),
        redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
        redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        redis.ResponseError(LOADING),  # a path that did not map the reply
        redis.ResponseError(OOM),
        redis.ResponseError(f"Command # 2 (XADD run:tasks * data b'...') of pipeline caused error: {LOADING}"),
    ],
)
def test_outages_are_retried_whatever_class_they_arrive_as(exc: Exception) -> None:
    assert is_redis_outage(exc)


def test_a_plain_loading_reply_is_classed_as_busy_loading() -> None:
    outage = as_redis_outage(redis.ResponseError(LOADING))
    assert isinstance(outage, redis.exceptions.BusyLoadingError)
    assert isinstance(outage, redis.ConnectionError)  # what every `except ConnectionError` policy expects


@pytest.mark.parametrize(
    "exc",
    [
        redis.ResponseError("NOGROUP No such key 'tasks' or consumer group 'g'"),
        redis.ResponseError("BUSYGROUP Consumer Group name already exists"),
        redis.ResponseError("Error running script: user_script:1: attempt to compare nil with number"),
        redis.ResponseError("a message that merely mentions LOADING later"),
        redis.ResponseError(),
        redis.exceptions.NoScriptError("No matching script"),
        redis.exceptions.DataError("Invalid input"),
        ValueError(LOADING),
    ],
)
def test_other_errors_are_bugs_that_propagate(exc: Exception) -> None:
    assert not is_redis_outage(exc)
    assert as_redis_outage(exc) is None


def test_call_with_retry_waits_out_a_plain_loading_reply_and_raises_a_bug_at_once() -> None:
    replies: list[Exception | str] = [redis.ResponseError(LOADING), redis.ResponseError(LOADING), "ok"]

    def call() -> str:
        reply = replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    assert call_with_retry(call, "read", backoff=Backoff(initial_s=0.001, max_s=0.001)) == "ok"

    num_calls = 0

    def bug() -> None:
        nonlocal num_calls
        num_calls += 1
        raise redis.ResponseError("NOGROUP No such key")

    with pytest.raises(redis.ResponseError, match="NOGROUP"):
        call_with_retry(bug, "read", backoff=Backoff(initial_s=0.001, max_s=0.001))
    assert num_calls == 1


def test_the_coordinator_answers_an_outage_reply_503_and_any_other_error_reply_500() -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/raises/{reply}")
    def raises(reply: str) -> None:
        raise redis.ResponseError(reply)

    with TestClient(app, raise_server_exceptions=False) as client:
        loading = client.get(f"/raises/{LOADING}")
        assert loading.status_code == 503
        assert loading.headers["Retry-After"] == "1"
        assert loading.json()["detail"].startswith("redis is loading its data")
        assert client.get(f"/raises/{OOM}").json()["detail"].startswith("redis is full")
        assert client.get("/raises/NOGROUP No such key").status_code == 500
