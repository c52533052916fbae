"""Delta size of a policy version at real learning rates per learner precision, every codec of
shared/weight_channel/delta.py and the pick; with each precision's step time and learner bytes per parameter.
With `--config`, the same question on a run file's real model, published as the learner publishes it.

    python -m benchmarks.delta_size          # make bench-delta; writes benchmarks/results/delta_size.json
    python -m benchmarks.delta_size --config configs/smollm2.toml   # writes benchmarks/results/delta_size_smollm2.json

A Qwen3-style causal LM of ~128M parameters (hidden 768, 12 layers, vocab 32k, tied embeddings,
random init from a fixed seed, no download) takes real AdamW steps (the learner's settings:
services/learner/trainer.make_optimizer, weight decay 0.0, gradients clipped to norm 1.0) on next-token
cross entropy over random token batches (2 x 128), at each learning rate, in each `[learner] precision`
(services/learner/precision.py):

    mixed   float32 master weights and AdamW state, bf16 compute (autocast): the default for real models
    bf16    parameters, gradients and AdamW moments in bf16 (precision = "bf16")
    fp32    float32 throughout

Every precision publishes the bf16 rounding of its weights (a bf16 checkpoint's dtype). After
`--warmup-steps`, the published weights are serialised exactly like the learner
(services/learner/publish.serialize_weights) after each of `--steps` steps, and every consecutive pair
of versions is encoded with every codec (size, encode and decode seconds) and with encode_smallest.
Step time: forward, backward, clipping and the AdamW step of one batch (no publication), the mean over
the measured steps; bytes per parameter: the parameters, their gradients and the optimizer state.

With `--config RUN.toml` (`make bench-delta ARGS="--config configs/smollm2.toml"`): the run file's model
(`--model-dir`, else its `[model] path`, else the catalog model its `[model] init` names, cached by `make
model`) in the learner's own Policy (services/learner/policy.py: the run's `[learner] precision`, AdamW at the
run's learning rate with torch's default betas and eps, weight decay, gradient clipping, micro-batches) takes
`--steps` real GRPO steps: each samples prompts of the run's task with the workers' torch engine holding the
last published version (in the published dtype, at the run's temperature and max_new_tokens), scores them with
the task's verifier and, as `[grpo] dynamic_sampling` does, keeps only groups whose rewards differ (sampling
`--prompts-per-round` prompts at a time until `groups_per_step` are found, or at least one once
`--max-groups-per-step` were generated), then trains on them (services/learner/trainer.train_step through
Policy.train_step). Every version, the base as version 0 included, goes out through the learner's own
WeightPublisher (shared/weight_channel/publisher.py, the run's `[broadcast]` chunk size, `full_every` and zstd
level, a real Redis for its announcements): per version, the full bytes, the payload it announced (delta or
full, codec, bytes), the publish time (encode_smallest included), the share of bf16 words that changed
(all tensors; the tied embedding and the rest apart) and the decode time of the delta, checked exact.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from benchmarks.ppo_minibatches import sample_groups
from benchmarks.vs_trl import model_folder
from cluster.redis_server import RedisServer
from engines.torch_engine import TorchEngine
from services.learner.batch import tensorize
from services.learner.policy import Policy
from services.learner.publish import publication_state, serialize_weights
from shared.bus import StreamBus, connect
from shared.config import RunConfig, load_run_config
from shared.flat_groups import is_flat
from shared.keys import RunKeys
from shared.messages import ScoredGroup
from shared.signing import Ed25519PrivateKey
from shared.tasks import TaskAdapter, build_task
from shared.weight_channel import ChunkStore, PublishedVersion, WeightPublisher, parse_blob
from shared.weight_channel.delta import CODECS, apply_delta, encode_smallest, encode_with

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULTS = RESULTS_DIR / "delta_size.json"
MODEL_CONFIG = {
    "vocab_size": 32_000,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "tie_word_embeddings": True,
    "max_position_embeddings": 512,
}
WEIGHT_DECAY = 0.0  # GRPOConfig.weight_decay default and configs/qwen3.toml
MAX_GRAD_NORM = 1.0  # GRPOConfig.max_grad_norm


class Trainer:
    """One (precision, lr): the trained model, its optimizer, and the bf16 model it publishes."""

    def __init__(self, precision: str, lr: float, config: Qwen3Config, init: dict) -> None:
        self.precision = precision
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.model = AutoModelForCausalLM.from_config(config).to(dtype)
        self.model.load_state_dict(init)  # cast to the precision's dtype
        self.published = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=WEIGHT_DECAY)
        self.step_s: list[float] = []

    def step(self, step_index: int, batch_size: int, seq_len: int) -> float:
        generator = torch.Generator().manual_seed(step_index)  # the same batches for every precision and lr
        input_ids = torch.randint(0, MODEL_CONFIG["vocab_size"], (batch_size, seq_len), generator=generator)
        started_s = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.precision == "mixed")
        with autocast:
            loss = self.model(input_ids=input_ids, labels=input_ids).loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM)
        self.optimizer.step()
        self.step_s.append(time.perf_counter() - started_s)
        with torch.no_grad():  # what is published: the bf16 rounding of the weights
            self.published.load_state_dict(self.model.state_dict())
        return float(loss.detach())

    def bytes_per_parameter(self) -> float:
        parameters = list(self.model.parameters())
        num_bytes = sum(p.numel() * p.element_size() for p in parameters)
        num_bytes += sum(p.grad.numel() * p.grad.element_size() for p in parameters if p.grad is not None)
        for state in self.optimizer.state.values():
            num_bytes += sum(t.numel() * t.element_size() for t in state.values() if t.dim() > 0)
        return num_bytes / sum(p.numel() for p in parameters)


def time_precisions(config: Qwen3Config, init: dict, args: argparse.Namespace) -> list[dict]:
    """Step time per precision, side by side: one trainer each, warmed up by a step, then `timing_rounds`
    rounds in which every precision takes one step in turn, so a machine whose load drifts loads them
    alike. Per precision: the median step and its ratio to float32's."""
    trainers = {precision: Trainer(precision, args.lrs[0], config, init) for precision in args.precisions}
    for trainer in trainers.values():
        trainer.step(0, args.batch_size, args.seq_len)
        trainer.step_s.clear()
    for round_index in range(args.timing_rounds):
        for trainer in trainers.values():
            trainer.step(1 + round_index, args.batch_size, args.seq_len)
    medians = {precision: float(np.median(trainer.step_s)) for precision, trainer in trainers.items()}
    reference_s = medians.get("fp32")
    return [
        {
            "precision": precision,
            "step_s_median": round(median_s, 3),
            "step_s_all": [round(step_s, 3) for step_s in trainers[precision].step_s],
            "vs_fp32": round(median_s / reference_s, 3) if reference_s else None,
            "bytes_per_parameter": round(trainers[precision].bytes_per_parameter(), 2),
        }
        for precision, median_s in medians.items()
    ]


def measure_pair(base: bytes, target: bytes) -> dict:
    """Changed 16-bit words, and per codec: size fraction, encode and decode seconds; then the pick."""
    changed = np.frombuffer(base, dtype=np.uint16) != np.frombuffer(target, dtype=np.uint16)
    row: dict = {"full_bytes": len(target), "changed_fraction_16bit": round(float(changed.mean()), 6), "codecs": {}}
    for codec in CODECS:
        started_s = time.perf_counter()
        delta = encode_with(codec, base, target)
        encode_s = time.perf_counter() - started_s
        started_s = time.perf_counter()
        rebuilt = apply_delta(base, delta)
        decode_s = time.perf_counter() - started_s
        assert rebuilt == target, codec
        row["codecs"][codec] = {
            "delta_bytes": len(delta),
            "size_fraction": round(len(delta) / len(target), 5),
            "encode_s": round(encode_s, 3),
            "decode_s": round(decode_s, 3),
        }
    started_s = time.perf_counter()
    chosen, delta = encode_smallest(base, target)
    encode_s = time.perf_counter() - started_s
    started_s = time.perf_counter()
    assert apply_delta(memoryview(base), memoryview(delta)) == target
    decode_s = time.perf_counter() - started_s
    row["chosen"] = {
        "codec": chosen,
        "size_fraction": round(len(delta) / len(target), 5),
        "encode_smallest_s": round(encode_s, 3),
        "decode_s": round(decode_s, 3),
    }
    return row


def run(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    config = Qwen3Config(**MODEL_CONFIG)
    init = dict(AutoModelForCausalLM.from_config(config).state_dict())  # fp32, random init
    num_parameters = sum(tensor.numel() for name, tensor in init.items() if name != "lm_head.weight")
    print(f"{num_parameters / 1e6:.1f}M parameters, torch {torch.__version__}", flush=True)
    runs, precisions = [], []
    for precision in [] if args.skip_deltas else args.precisions:
        for lr in args.lrs:
            trainer = Trainer(precision, lr, config, init)
            for step_index in range(args.warmup_steps):
                trainer.step(step_index, args.batch_size, args.seq_len)
            previous = serialize_weights(trainer.published)
            trainer.step_s.clear()  # warm-up steps are not timed
            for step_index in range(args.warmup_steps, args.warmup_steps + args.steps):
                loss = trainer.step(step_index, args.batch_size, args.seq_len)
                blob = serialize_weights(trainer.published)
                row = {"precision": precision, "lr": lr, "step": step_index, "loss": round(loss, 4)}
                row.update(measure_pair(previous, blob))
                runs.append(row)
                print_row(row)
                previous = blob
            precisions.append(
                {
                    "precision": precision,
                    "lr": lr,
                    "step_s_mean": round(float(np.mean(trainer.step_s)), 3),
                    "bytes_per_parameter": round(trainer.bytes_per_parameter(), 2),
                }
            )
            print(json.dumps(precisions[-1]), flush=True)
    step_times = time_precisions(config, init, args) if args.timing_rounds else []
    print(json.dumps(step_times), flush=True)
    return {
        "command": " ".join(["python -m benchmarks.delta_size", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "host": {"cpus": os.cpu_count(), "torch_threads": args.threads, "python": platform.python_version()},
        "model_config": {"architecture": "Qwen3ForCausalLM", **MODEL_CONFIG},
        "num_parameters": num_parameters,
        "published_dtype": "bfloat16",
        "optimizer": {"name": "AdamW", "weight_decay": WEIGHT_DECAY, "max_grad_norm": MAX_GRAD_NORM},
        "batch": {"batch_size": args.batch_size, "seq_len": args.seq_len},
        "warmup_steps": args.warmup_steps,
        "precisions": precisions,
        "step_times": step_times,
        "runs": runs,
        "summary": summarise(runs),
    }


def summarise(runs: list[dict]) -> list[dict]:
    """Per (set-up, lr): the mean over its version pairs."""
    summary = []
    for key in dict.fromkeys((row["precision"], row["lr"]) for row in runs):
        rows = [row for row in runs if (row["precision"], row["lr"]) == key]
        summary.append(
            {
                "precision": key[0],
                "lr": key[1],
                "num_pairs": len(rows),
                "changed_fraction_16bit": mean(row["changed_fraction_16bit"] for row in rows),
                **{codec: mean(row["codecs"][codec]["size_fraction"] for row in rows) for codec in CODECS},
                "chosen": sorted({row["chosen"]["codec"] for row in rows}),
                "chosen_size_fraction": mean(row["chosen"]["size_fraction"] for row in rows),
                "encode_smallest_s": mean(row["chosen"]["encode_smallest_s"] for row in rows),
                "decode_s": mean(row["chosen"]["decode_s"] for row in rows),
            }
        )
    return summary


def mean(values: object) -> float:
    return round(float(np.mean(list(values))), 5)  # type: ignore[call-overload]


def print_row(row: dict) -> None:
    sizes = "  ".join(f"{codec.split('-')[0]} {row['codecs'][codec]['size_fraction']:.4f}" for codec in CODECS)
    chosen = row["chosen"]
    print(
        f"{row['precision']:>4} lr {row['lr']:.0e} step {row['step']}: changed {row['changed_fraction_16bit']:.4f}  "
        f"{sizes}  -> {chosen['codec'].split('-')[0]} {chosen['size_fraction']:.4f} "
        f"(encode {chosen['encode_smallest_s']:.2f}s, decode {chosen['decode_s']:.2f}s)",
        flush=True,
    )


def run_model(args: argparse.Namespace) -> dict:
    """--config: `args.steps` real GRPO steps of the run file's model, every version published by the
    learner's WeightPublisher; one row per version (see the module doc)."""
    started_s = time.perf_counter()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    run = load_run_config(args.config)
    if run.lora.enabled:
        raise ValueError(f"{args.config}: a LoRA run publishes its adapter whole, never a delta (docs/lora.md)")
    model_dir = model_folder(run.model.model_dump(), args.model_dir) or run.model.path
    if model_dir is None:
        raise ValueError(f"{args.config} names no model folder: pass --model-dir")
    policy = Policy(model_dir, run)  # the learner's: precision, AdamW at the run's lr, clipping, micro-batches
    engine = TorchEngine(model_dir, dtype=policy.precision.publish_dtype)  # samples what workers would load
    task = build_task(run.task)
    prompt_rng = torch.Generator().manual_seed(args.seed)
    print(f"{model_dir}: {policy.precision.mode} precision, lr {run.grpo.learning_rate}", flush=True)
    versions: list[dict] = []
    with local_publisher(run, policy.precision.publish_dtype) as publisher:
        published = publisher.publish(publication_state(policy.weights()), 0)  # the base, as the learner's start
        previous = bytes(publisher.store.payload(published.full_manifest))
        versions.append(version_row(published, previous, None, publisher.store))
        for version in range(1, args.steps + 1):
            engine.load_weights(previous, version - 1)  # the worker's swap: the last published bytes
            groups, num_generated, sample_s = sample_trainable_groups(engine, task, run, prompt_rng, version - 1, args)
            batch = tensorize(groups, engine.pad_token_id, run.grpo.normalize_advantage_by_std)
            step = policy.train_step(batch, [group.rollout.num_samples for group in groups], shuffle_seed=version)
            published = publisher.publish(publication_state(policy.weights()), version)
            blob = bytes(publisher.store.payload(published.full_manifest))
            row = version_row(published, blob, previous, publisher.store)
            row["step"] = {
                "num_groups_generated": num_generated,
                "num_groups_trained": len(groups),
                "reward_mean": round(float(batch.rewards.mean()), 4),
                "loss": round(step.diagnostics.loss, 5),
                "grad_norm": round(step.diagnostics.grad_norm, 4),
                "sample_s": round(sample_s, 2),
                "train_s": round(step.train_s, 2),
            }
            versions.append(row)
            print_version(row)
            previous = blob
    return {
        "command": " ".join(["python -m benchmarks.delta_size", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - started_s, 1),  # model loading, steps, publication, checks
        **model_run_settings(args, run, policy, model_dir),
        "versions": versions,
        "summary": summarise_versions(versions),
    }


def model_run_settings(args: argparse.Namespace, run: RunConfig, policy: Policy, model_dir: Path) -> dict:
    """What the measurement ran on and with: host, model, the learner's optimizer, sampling, publication."""
    return {
        "torch": torch.__version__,
        "host": {
            "cpus": os.cpu_count(),
            "torch_threads": args.threads,
            "python": platform.python_version(),
            "load_average_at_end": [round(load, 2) for load in os.getloadavg()],  # other jobs sharing the cores
        },
        "config": str(args.config),
        "model": {
            "folder": model_dir.name,
            "architecture": policy.config.architectures[0],
            "num_parameters": sum(p.numel() for p in policy.model.parameters()),
        },
        "learner": {
            "precision": policy.precision.mode,
            "published_dtype": str(policy.precision.publish_dtype).removeprefix("torch."),
            "optimizer": optimizer_settings(policy.optimizer),
            "max_grad_norm": run.grpo.max_grad_norm,
            "micro_batch_size": run.learner.micro_batch_size,
        },
        "grpo": {
            "group_size": run.grpo.group_size,
            "groups_per_step": run.grpo.groups_per_step,
            "temperature": run.grpo.temperature,
            "max_new_tokens": run.grpo.max_new_tokens,
            "dynamic_sampling": run.grpo.dynamic_sampling,
            "max_groups_per_step": args.max_groups_per_step,
        },
        "broadcast": {"chunk_size_bytes": run.broadcast.chunk_size_bytes, "full_every": run.broadcast.full_every},
    }


@contextmanager
def local_publisher(run: RunConfig, dtype: torch.dtype) -> Iterator[WeightPublisher]:
    """The learner's WeightPublisher as services/learner/learner.py builds it (the run's [broadcast] chunk size,
    full_every and zstd level; floating tensors published in `dtype`), its store spilling to a temporary folder,
    announcing on a private Redis. K is the run file's `full_every` even where its `delta` is off (the learner
    would make K 1 then): what the deltas would weigh is the question. Nobody fetches: no chunk server."""
    with tempfile.TemporaryDirectory(prefix="delta-size-") as folder:
        redis = RedisServer(Path(folder) / "redis", append_only=False).start()
        keys = RunKeys(f"delta-size-{os.getpid()}")
        store = ChunkStore(keep_versions=run.broadcast.keep_versions, spill_dir=Path(folder) / "published")
        publisher = WeightPublisher(
            StreamBus(connect(redis.url), keys, service="learner"),
            keys,
            store,
            public_url="http://delta-size.invalid",
            signing_key=Ed25519PrivateKey.generate(),
            chunk_size_bytes=run.broadcast.chunk_size_bytes,
            full_every=run.broadcast.full_every,
            dtype=dtype,
        )
        try:
            yield publisher
        finally:
            publisher.close()
            store.spares.discard()
            redis.stop()


def summarise_versions(versions: list[dict]) -> dict:
    """The versions after the base: mean and largest delta, and the share of bf16 words changed per step."""
    deltas = [row for row in versions if row["payload"] == "delta"]
    stepped = versions[1:]
    return {
        "full_bytes": versions[0]["full_bytes"],
        "num_versions_after_base": len(stepped),
        "num_delta_versions": len(deltas),
        "codecs": sorted({row["codec"] for row in deltas}),
        "delta_bytes_mean": round(float(np.mean([row["payload_bytes"] for row in deltas]))) if deltas else None,
        "delta_bytes_max": max((row["payload_bytes"] for row in deltas), default=None),
        "delta_size_fraction_mean": mean(row["size_fraction"] for row in deltas) if deltas else None,
        "delta_size_fraction_max": max((row["size_fraction"] for row in deltas), default=None),
        "changed_fraction_mean": mean(row["changed_fraction"] for row in stepped),
        "changed_fraction_max": max(row["changed_fraction"] for row in stepped),
        "delta_publish_s_mean": mean(row["publish_s"] for row in deltas) if deltas else None,
        "decode_s_mean": mean(row["decode_s"] for row in deltas) if deltas else None,
    }


def sample_trainable_groups(
    engine: TorchEngine,
    task: TaskAdapter,
    run: RunConfig,
    prompt_rng: torch.Generator,
    policy_version: int,
    args: argparse.Namespace,
) -> tuple[list[ScoredGroup], int, float]:
    """Scored groups to train on, as the learner collects them: with dynamic sampling only groups whose
    rewards differ (a flat group's advantages are all 0), sampled `--prompts-per-round` prompts at a time
    until `groups_per_step` are found, or at least one once `--max-groups-per-step` were generated.
    Returns (groups, groups generated, sampling seconds)."""
    grpo = run.grpo
    trainable: list[ScoredGroup] = []
    num_generated, started_s = 0, time.perf_counter()
    while len(trainable) < grpo.groups_per_step and (num_generated < args.max_groups_per_step or not trainable):
        picks = torch.randint(len(task.train_set), (args.prompts_per_round,), generator=prompt_rng).tolist()
        groups = sample_groups(engine, task, [task.train_set[index] for index in picks], grpo, policy_version)
        num_generated += len(groups)
        trainable += [group for group in groups if not (grpo.dynamic_sampling and is_flat(group.rewards))]
    return trainable[: grpo.groups_per_step], num_generated, time.perf_counter() - started_s


def version_row(published: PublishedVersion, blob: bytes, previous: bytes | None, store: ChunkStore) -> dict:
    """One published version: what went out, how its bf16 words differ from the last version's (None for
    the first) and the seconds a worker holding the base takes to rebuild it (None for a full payload)."""
    manifest = published.manifest
    row: dict = {
        "policy_version": manifest.policy_version,
        "payload": manifest.payload,
        "codec": manifest.codec if manifest.payload == "delta" else None,
        "full_bytes": published.full_manifest.total_size_bytes,
        "payload_bytes": manifest.total_size_bytes,
        "size_fraction": round(published.size_fraction, 5),
        "publish_s": round(published.publish_s, 3),
        "changed_fraction": None,
        "changed_fraction_embedding": None,
        "changed_fraction_rest": None,
        "decode_s": None,
    }
    if previous is not None:
        row.update(changed_words(previous, blob))
    if previous is not None and manifest.payload == "delta":  # a worker holding the base: rebuild, exactly
        started_s = time.perf_counter()
        rebuilt = apply_delta(previous, store.payload(manifest))
        row["decode_s"] = round(time.perf_counter() - started_s, 3)
        assert rebuilt == blob, f"version {manifest.policy_version}: the delta does not rebuild the full bytes"
    return row


def changed_words(base: bytes, target: bytes) -> dict:
    """The share of 16-bit weight words (bf16 values) that differ, over every tensor, the embedding alone
    (tied: it is the LM head too) and the rest."""
    num_changed = {"embedding": 0, "rest": 0}
    num_words = {"embedding": 0, "rest": 0}
    base_tensors, target_tensors = parse_blob(base), parse_blob(target)
    for name, tensor in target_tensors.items():
        assert tensor.element_size() == 2, f"{name}: {tensor.dtype}, not a 16-bit weight"
        part = "embedding" if "embed_tokens" in name else "rest"
        num_changed[part] += int((base_tensors[name].view(torch.int16) != tensor.view(torch.int16)).sum())
        num_words[part] += tensor.numel()
    return {
        "changed_fraction": round(sum(num_changed.values()) / sum(num_words.values()), 6),
        "changed_fraction_embedding": round(num_changed["embedding"] / max(1, num_words["embedding"]), 6),
        "changed_fraction_rest": round(num_changed["rest"] / max(1, num_words["rest"]), 6),
    }


def optimizer_settings(optimizer: torch.optim.Optimizer) -> dict:
    group = optimizer.param_groups[0]
    return {
        "name": type(optimizer).__name__,
        "lr": group["lr"],
        "betas": list(group["betas"]),
        "eps": group["eps"],
        "weight_decay": group["weight_decay"],
    }


def print_version(row: dict) -> None:
    step = row["step"]
    print(
        f"v{row['policy_version']}: {row['payload']} {row['codec'] or ''} {row['payload_bytes']:,} of "
        f"{row['full_bytes']:,} bytes ({row['size_fraction']:.4f}), bf16 words changed {row['changed_fraction']:.4f} "
        f"(embedding {row['changed_fraction_embedding']:.4f}, rest {row['changed_fraction_rest']:.4f}); "
        f"publish {row['publish_s']:.2f}s, decode {row['decode_s'] or 0.0:.2f}s; "
        f"{step['num_groups_trained']}/{step['num_groups_generated']} groups trained, reward {step['reward_mean']:.3f}, "
        f"sample {step['sample_s']:.0f}s, train {step['train_s']:.0f}s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precisions", nargs="+", choices=("mixed", "bf16", "fp32"), default=["mixed", "bf16", "fp32"])
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-6, 1e-5])
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--steps", type=int, help="measured steps: one version pair each (4; --config: 5)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--timing-rounds", type=int, default=5, help="round-robin steps per precision for the step times (0: none)"
    )
    parser.add_argument("--skip-deltas", action="store_true", help="only the step times and bytes per parameter")
    parser.add_argument("--config", type=Path, help="a run file: its real model, real GRPO steps (module doc)")
    parser.add_argument("--model-dir", type=Path, help="--config: the model folder (default: the run file's)")
    parser.add_argument("--prompts-per-round", type=int, default=4, help="--config: prompts sampled at a time")
    parser.add_argument(
        "--max-groups-per-step",
        type=int,
        default=12,
        help="--config: train on fewer groups once this many were sampled",
    )
    parser.add_argument(
        "--out", type=Path, help="default: results/delta_size.json, with --config delta_size_<run_id>.json"
    )
    args = parser.parse_args()
    if args.config is not None:
        args.steps = args.steps or 5  # the real model: 5 versions after the base
        result = run_model(args)
        out = args.out or RESULTS_DIR / f"delta_size_{load_run_config(args.config).run_id}.json"
    else:
        args.steps = args.steps or 4
        result = run(args)
        out = args.out or RESULTS
    print(json.dumps(result["summary"], indent=1))
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
