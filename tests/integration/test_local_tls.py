"""The local runner with --tls (cluster/local.py ClusterOptions.tls): a real `python -m services.coordinator` serving
https with the run's own certificate, for 127.0.0.1 and the extra addresses asked for, and every client the runner
starts or writes cluster.env for (workers, `make worker`, its own polls) verifying it with the run CA."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from cluster.join import parse_args, read_cluster_env, worker_environment
from cluster.local import ClusterOptions, LocalCluster

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """Redis and the coordinator of a local cluster with --tls --tls-host 10.78.0.1 (no learner, no workers)."""
    options = ClusterOptions(
        config_path=REPO_ROOT / "configs" / "demo.toml", runs_dir=tmp_path, tls=True, tls_hosts=("10.78.0.1",)
    )
    local = LocalCluster(options)
    local.run_dir.mkdir(parents=True)
    try:
        local.start_redis()
        local.start_coordinator()  # returns once GET /healthz answered over https, verified with the run CA
        local.write_cluster_env()
        yield local
    finally:
        local.stop()


def test_the_coordinator_serves_https_only_for_its_hosts_and_clients_get_the_run_ca(cluster: LocalCluster) -> None:
    tls = cluster.tls
    assert tls is not None and cluster.coordinator_url.startswith("https://127.0.0.1:")
    ca = ssl.create_default_context(cafile=str(tls.ca_file))
    assert httpx.get(cluster.coordinator_url + "/v1/status", verify=ca).status_code == 200
    with pytest.raises(httpx.HTTPError):  # the port speaks TLS only
        httpx.get(cluster.coordinator_url.replace("https://", "http://") + "/healthz", timeout=5)

    names = x509.load_pem_x509_certificate(tls.cert_file.read_bytes()).extensions
    addresses = names.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)
    assert {"127.0.0.1", "10.78.0.1"} <= {str(address) for address in addresses}  # the extra host: a namespace's
    assert f"sha256 {tls.cert_sha256}" in cluster.services["coordinator"].log_path.read_text()  # what one may pin

    cluster_env = read_cluster_env(cluster.run_dir)
    assert cluster_env["RL_COORDINATOR_CA_FILE"] == str(tls.ca_file)
    assert cluster.common_env()["RL_COORDINATOR_CA_FILE"] == str(tls.ca_file)  # every service's, workers' included
    # `make worker`: a credential issued over https with cluster.env's admin token and CA, and the CA handed on
    joined = worker_environment(cluster_env, parse_args(["--run-dir", str(cluster.run_dir), "--name", "joined"]))
    assert joined["RL_JOIN_TOKEN"].startswith("op-") and joined["RL_COORDINATOR_CA_FILE"] == str(tls.ca_file)
