"""`make keys` (relay-rl keys --compose --out .env, cluster/secrets.py): the workers' join credential is an operator
credential the coordinator accepts, and an existing .env gets the variables it lacks without a value changing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cluster.cli import main
from cluster.secrets import ClusterSecrets
from services.coordinator.operators import PROVISIONED_TOKEN_PATTERN


def env_values(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def test_the_workers_join_with_an_operator_credential_not_a_shared_token() -> None:
    env = ClusterSecrets.generate().compose_env()
    assert re.fullmatch(PROVISIONED_TOKEN_PATTERN, env["RL_OPERATOR_TOKEN"])  # what RL_OPERATOR_TOKENS accepts
    assert "RL_JOIN_TOKEN" not in env
    assert ClusterSecrets().operator_token != ClusterSecrets().operator_token


def test_an_older_env_file_gets_what_it_lacks_and_keeps_every_value(tmp_path: Path) -> None:
    """A .env written before compose took an operator credential: `make keys` adds RL_OPERATOR_TOKEN (the
    coordinator provisions it at its next start) and leaves the running cluster's secrets as they were."""
    env_file = tmp_path / ".env"
    main(["keys", "--compose", "--out", str(env_file)])
    before = env_values(env_file)
    older = {name: value for name, value in before.items() if name != "RL_OPERATOR_TOKEN"}
    older["RL_JOIN_TOKEN"] = "0123456789abcdef0123456789abcdef"  # what compose read before; kept, unread
    env_file.write_text("".join(f"{name}={value}\n" for name, value in older.items()) + "RL_PUBLIC_HOST=10.0.0.7")

    main(["keys", "--compose", "--out", str(env_file)])
    after = env_values(env_file)
    assert after == {**older, "RL_PUBLIC_HOST": "10.0.0.7", "RL_OPERATOR_TOKEN": after["RL_OPERATOR_TOKEN"]}
    assert re.fullmatch(PROVISIONED_TOKEN_PATTERN, after["RL_OPERATOR_TOKEN"])

    completed = env_file.read_text()
    main(["keys", "--compose", "--out", str(env_file)])  # nothing missing: nothing written
    assert env_file.read_text() == completed


def test_half_a_signing_pair_is_not_completed_with_a_key_that_would_not_match(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    main(["keys", "--compose", "--out", str(env_file)])
    kept = [line for line in env_file.read_text().splitlines() if not line.startswith("RL_SIGNING_KEY=")]
    env_file.write_text("\n".join(kept) + "\n")
    with pytest.raises(SystemExit, match="RL_WEIGHTS_PUBLIC_KEY but not RL_SIGNING_KEY"):
        main(["keys", "--compose", "--out", str(env_file)])
    assert env_file.read_text() == "\n".join(kept) + "\n"
