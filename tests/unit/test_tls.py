"""TLS wherever a credential travels (shared/tls.py, cluster/tls.py): which coordinator URLs a client refuses, how
the trust settings read, and what a run's certificates hold. Handshakes against real servers, and what a
capture of the traffic holds: tests/integration/test_coordinator_tls.py."""

from __future__ import annotations

import hashlib
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from pydantic import SecretStr, ValidationError

from cluster.tls import make_run_certificates, read_run_certificates
from services.coordinator.settings import CoordinatorSettings
from services.rollout.settings import RolloutSettings
from shared.tls import CoordinatorTrust, InsecureCoordinatorError, PinnedContext, is_loopback_host
from tests.weights_keys import PUBLIC_KEY_HEX


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000",
        "http://127.3.4.5:8000",
        "http://[::1]:8000",
        "http://localhost:8000",
        "http://LOCALHOST:8000/",
        "https://10.78.0.1:8000",
        "https://coordinator:8000",
    ],
)
def test_https_anywhere_and_plain_http_on_loopback_are_allowed(url: str) -> None:
    CoordinatorTrust().check_url(url)


@pytest.mark.parametrize(
    "url", ["http://10.78.0.1:8000", "http://coordinator:8000", "http://203.0.113.7", "http://[fd00::2]:8000"]
)
def test_plain_http_to_any_other_host_is_refused_in_one_line_unless_insecure(url: str) -> None:
    with pytest.raises(InsecureCoordinatorError) as refused:
        CoordinatorTrust().check_url(url)
    message = str(refused.value)
    assert "\n" not in message and "refusing plain http://" in message
    assert "--insecure" in message and "RL_INSECURE_HTTP=1" in message and "RL_COORDINATOR_CA_FILE" in message
    CoordinatorTrust(insecure_http=True).check_url(url)


def test_a_url_that_is_neither_http_nor_https_is_refused() -> None:
    with pytest.raises(InsecureCoordinatorError, match="neither https:// nor http://"):
        CoordinatorTrust(insecure_http=True).check_url("ftp://127.0.0.1/")


def test_a_host_name_that_only_looks_local_is_not_loopback() -> None:
    assert is_loopback_host("127.0.0.1") and is_loopback_host("::1") and is_loopback_host("localhost")
    assert not is_loopback_host("localhost.example.com") and not is_loopback_host("0.0.0.0")
    assert not is_loopback_host("127.0.0.1.nip.io")  # a name: it may resolve anywhere


def test_the_trust_reads_its_three_variables_and_normalizes_the_pin() -> None:
    digest = hashlib.sha256(b"a certificate").hexdigest()
    openssl_form = ":".join(digest[i : i + 2] for i in range(0, 64, 2)).upper()  # openssl x509 -fingerprint
    trust = CoordinatorTrust.from_env(
        {"RL_COORDINATOR_CA_FILE": "/run/ca.pem", "RL_COORDINATOR_CERT_SHA256": openssl_form, "RL_INSECURE_HTTP": "1"}
    )
    assert trust == CoordinatorTrust(Path("/run/ca.pem"), digest, insecure_http=True)
    assert trust.environment() == {
        "RL_COORDINATOR_CA_FILE": "/run/ca.pem",
        "RL_COORDINATOR_CERT_SHA256": digest,
        "RL_INSECURE_HTTP": "1",
    }
    assert CoordinatorTrust.from_env({"RL_INSECURE_HTTP": "0"}) == CoordinatorTrust()
    assert CoordinatorTrust.from_env({}).verify() is True  # the system's CAs: a coordinator behind a public one
    with pytest.raises(ValueError, match="not a SHA-256"):
        CoordinatorTrust.from_env({"RL_COORDINATOR_CERT_SHA256": "abc"})


def test_a_pin_verifies_no_chain_and_a_ca_file_that_is_missing_is_named(tmp_path: Path) -> None:
    pinned = CoordinatorTrust(cert_sha256="ab" * 32).verify()
    assert isinstance(pinned, PinnedContext) and pinned.pinned_sha256 == "ab" * 32
    assert pinned.verify_mode == ssl.CERT_NONE and not pinned.check_hostname  # the pin is the whole check
    with pytest.raises(ValueError, match=f"RL_COORDINATOR_CA_FILE={tmp_path / 'no-ca.pem'}"):
        CoordinatorTrust(ca_file=tmp_path / "no-ca.pem").verify()


def test_a_workers_settings_read_the_trust_from_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = make_run_certificates(tmp_path / "tls", ["127.0.0.1"])
    monkeypatch.setenv("RL_COORDINATOR_URL", "https://10.78.0.1:8000")
    monkeypatch.setenv("RL_COORDINATOR_CA_FILE", str(tls.ca_file))
    monkeypatch.setenv("RL_COORDINATOR_CERT_SHA256", tls.cert_sha256.upper())
    settings = RolloutSettings(weights_public_key=PUBLIC_KEY_HEX)
    assert (settings.coordinator_ca_file, settings.coordinator_cert_sha256) == (tls.ca_file, tls.cert_sha256)
    verify = settings.coordinator_verify()
    assert isinstance(verify, PinnedContext) and verify.verify_mode == ssl.CERT_REQUIRED  # the CA as well

    plain = RolloutSettings(weights_public_key=PUBLIC_KEY_HEX, coordinator_url="http://10.78.0.1:8000")
    with pytest.raises(InsecureCoordinatorError):
        plain.coordinator_verify()
    monkeypatch.setenv("RL_INSECURE_HTTP", "1")
    assert RolloutSettings(weights_public_key=PUBLIC_KEY_HEX, coordinator_url="http://10.78.0.1:8000").insecure_http


def test_a_run_certificate_names_its_hosts_chains_to_its_ca_and_keeps_its_key_private(tmp_path: Path) -> None:
    tls = make_run_certificates(tmp_path / "tls", ["coordinator", "10.78.0.1", "::1", "coordinator"])
    assert tls.key_file.stat().st_mode & 0o777 == 0o600
    assert tls.ca_file.stat().st_mode & 0o777 == tls.cert_file.stat().st_mode & 0o777 == 0o644
    certificate = x509.load_pem_x509_certificate(tls.cert_file.read_bytes())
    ca = x509.load_pem_x509_certificate(tls.ca_file.read_bytes())
    certificate.verify_directly_issued_by(ca)
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["coordinator"]  # once, however often it was given
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.78.0.1"), ipaddress.ip_address("::1")]
    assert not certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert tls.cert_sha256 == hashlib.sha256(ssl.PEM_cert_to_DER_cert(tls.cert_file.read_text())).hexdigest()
    assert read_run_certificates(tmp_path / "tls") == tls
    assert "PRIVATE KEY" not in tls.ca_file.read_text() + tls.cert_file.read_text()  # the CA's key: nowhere

    with pytest.raises(FileExistsError, match="exists"):
        make_run_certificates(tmp_path / "tls", ["coordinator"])
    again = make_run_certificates(tmp_path / "tls", ["coordinator"], overwrite=True)
    assert again.cert_sha256 != tls.cert_sha256 and again.key_file.stat().st_mode & 0o777 == 0o600


def test_the_coordinator_takes_a_certificate_and_its_key_together_or_neither() -> None:
    admin_token = SecretStr("admin-token-0123456789")
    plain = CoordinatorSettings(admin_token=admin_token, open_registration=True)
    assert plain.tls_cert_file is None  # plain http (loopback: the local demo)
    with pytest.raises(ValidationError, match="RL_TLS_CERT_FILE and RL_TLS_KEY_FILE go together"):
        CoordinatorSettings(admin_token=admin_token, open_registration=True, tls_cert_file=Path("server.pem"))
