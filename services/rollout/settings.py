"""Where a rollout worker runs and what it tells the coordinator about itself (`RL_*` environment)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator

from shared.config import EngineKind, ModelConfig, ProcessSettings, resolve_model_dir
from shared.signing import KEY_HEX_PATTERN, Ed25519PublicKey, load_public_key
from shared.tls import CoordinatorTrust, Verify, normalize_sha256


class RolloutSettings(ProcessSettings):
    """Rollout worker settings; the experiment itself comes from the run file (RL_RUN_CONFIG). No Redis: a
    worker reaches the run only through the coordinator (RL_COORDINATOR_URL), with the token it registers for."""

    model_dir: Path | None = Field(
        None, description="HF model folder (config + tokenizer); default [model] path, else <run_dir>/model"
    )
    # The public half only: a worker verifies the learner's weights but holds nothing that can sign them.
    weights_public_key: str = Field(
        pattern=KEY_HEX_PATTERN,
        description="the learner's Ed25519 public key (hex of 32 bytes) that verifies weight manifests",
    )
    join_token: SecretStr | None = Field(
        None, description="the cluster's join token, sent to register (RL_JOIN_TOKEN; None: open registration)"
    )
    # how the worker knows the coordinator before it sends a token (shared/tls.py)
    coordinator_ca_file: Path | None = Field(
        None, description="the run CA (PEM) the coordinator's https certificate must chain to (None: system CAs)"
    )
    coordinator_cert_sha256: str | None = Field(
        None, description="pin: the SHA-256 of the coordinator's https certificate (64 hex; the chain is not checked)"
    )
    insecure_http: bool = Field(
        False, description="allow a plain http:// coordinator that is not on loopback (tokens in clear text: test beds)"
    )
    worker_engine: EngineKind | None = Field(
        None, description="inference engine (torch, vllm, auto); overrides the run file's [rollout] engine"
    )
    worker_num_threads: int = Field(1, ge=1, description="CPU threads of the inference engine")
    worker_name: str = Field("rollout", min_length=1, max_length=64, description="label shown by the coordinator")
    worker_host: str = Field("127.0.0.1", description="interface this worker's chunk server binds and advertises")
    worker_port: int = Field(0, ge=0, le=65535, description="chunk server port (0: any free port)")
    worker_public_url: str | None = Field(
        None,
        description="how other workers reach this chunk server to relay weights; default http://<worker_host>:<bound port>",
    )
    worker_price_per_hour: float = Field(0.0, ge=0, description="what this worker costs, $/h")
    worker_gpu_type: str = Field("cpu", min_length=1, description="accelerator kind reported at registration")
    worker_bandwidth_mbps: float = Field(1000.0, gt=0, description="link speed reported at registration, Mbit/s")
    worker_region: str = Field("local", min_length=1, description="where this worker runs")
    worker_max_groups_per_batch: int = Field(
        16, ge=1, le=64, description="tasks leased at once and sampled in one engine call (more: faster, coarser)"
    )
    worker_poll_s: float = Field(0.2, gt=0, description="pause between checks while waiting for admissible weights")

    @field_validator("coordinator_cert_sha256")
    @classmethod
    def _fingerprint(cls, value: str | None) -> str | None:
        return None if value is None else normalize_sha256(value)

    def public_key(self) -> Ed25519PublicKey:
        return load_public_key(self.weights_public_key)

    def coordinator_verify(self) -> Verify:
        """httpx's `verify=` for every call to the coordinator; InsecureCoordinatorError (a ValueError) for a plain
        http:// URL whose host is not loopback, unless RL_INSECURE_HTTP."""
        trust = CoordinatorTrust(self.coordinator_ca_file, self.coordinator_cert_sha256, self.insecure_http)
        return trust.verify_for(self.coordinator_url)

    def join_token_value(self) -> str | None:
        return None if self.join_token is None else self.join_token.get_secret_value()

    def resolved_model_dir(self, model: ModelConfig) -> Path:
        return resolve_model_dir(self.model_dir, model, self.run_dir)

    def resolved_public_url(self, bound_url: str) -> str:
        """The chunk-server URL advertised at registration: RL_WORKER_PUBLIC_URL, else the bound one."""
        return (self.worker_public_url or bound_url).rstrip("/")
