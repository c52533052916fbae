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


def test_the_workers_join_with_an_operator_credential_not_a_shared_token(tmp_path: Path) -> None:
    env = ClusterSecrets.generate().compose_env(tmp_path / "tls")
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


def test_make_keys_makes_the_coordinators_tls_beside_the_env_file_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make keys`: a run CA and the coordinator's certificate for compose's names (and --tls-host) in tls/ beside
    .env, which names the folder (RL_TLS_DIR); the key is 0600. Run again, the set is kept (a running cluster's
    workers trust that CA); half a set is an error, never silently replaced."""
    from cryptography import x509

    from cluster.tls import read_run_certificates

    env_file = tmp_path / ".env"
    main(["keys", "--compose", "--out", str(env_file), "--tls-host", "203.0.113.7"])
    tls = read_run_certificates(tmp_path / "tls")
    assert env_values(env_file)["RL_TLS_DIR"] == str((tmp_path / "tls").resolve())
    assert tls.key_file.stat().st_mode & 0o777 == 0o600
    assert tls.cert_sha256 in capsys.readouterr().err  # what a worker may pin, said once
    names = x509.load_pem_x509_certificate(tls.cert_file.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert set(map(str, names.value.get_values_for_type(x509.IPAddress))) == {"127.0.0.1", "203.0.113.7"}
    assert set(names.value.get_values_for_type(x509.DNSName)) == {"coordinator", "localhost"}

    main(["keys", "--compose", "--out", str(env_file)])
    assert read_run_certificates(tmp_path / "tls") == tls

    moved = (tmp_path / "tls").rename(tmp_path / "elsewhere")  # the set .env names is the one kept
    env_file.write_text(env_file.read_text().replace(str(tmp_path / "tls"), str(moved)))
    main(["keys", "--compose", "--out", str(env_file)])
    assert not (tmp_path / "tls").exists() and read_run_certificates(moved).cert_sha256 == tls.cert_sha256

    read_run_certificates(moved).key_file.unlink()
    with pytest.raises(SystemExit, match="not the whole set"):
        main(["keys", "--compose", "--out", str(env_file)])


def test_keys_with_tls_hosts_alone_makes_a_set_for_exactly_those(tmp_path: Path) -> None:
    """`relay-rl keys --tls-host NAME --tls-dir DIR`: a coordinator started by hand (RL_TLS_CERT_FILE ...)."""
    from cryptography import x509

    from cluster.tls import read_run_certificates

    main(["keys", "--tls-host", "coord.example.com", "--tls-host", "10.78.0.1", "--tls-dir", str(tmp_path / "t")])
    tls = read_run_certificates(tmp_path / "t")
    names = x509.load_pem_x509_certificate(tls.cert_file.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert names.value.get_values_for_type(x509.DNSName) == ["coord.example.com"]
    assert list(map(str, names.value.get_values_for_type(x509.IPAddress))) == ["10.78.0.1"]
