# One image for every service and for a worker on any machine (docs/docker.md):
#   docker build -t relay-rl:latest .                              CPU: torch's CPU wheel (the demo, CPU workers)
#   docker build --build-arg VARIANT=gpu -t relay-rl:latest-gpu .  GPU: vllm==0.33.0 and the CUDA torch it pins
# docker-compose.yml and the Helm chart (deploy/relay-rl) pick the command; a worker on another machine:
#   docker run --rm -v $PWD/tls/ca.pem:/ca.pem:ro relay-rl:latest relay-rl worker --coordinator https://<host>:8000
#       --ca-file /ca.pem --token=<join token>     (the coordinator's run CA: make keys wrote it to tls/)
# (add --gpus all and the -gpu tag for --engine vllm).
#
# Three stages: the builder has a C compiler (reasoning-gym needs pycosat, which ships no wheel) and builds the
# dependencies' virtual environment in /opt/venv; the wheel stage builds the project's own wheel from its
# sources; the runtime image gets that folder and installs the wheel into it, no compiler. The project is
# installed, not editable: the services import it from site-packages, and /app holds only the run files.
# Every version is pinned: the base image by its full tag, each Python package by docker/requirements-*.txt
# (`make docker-lock` regenerates them), torch by its exact build.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm

FROM ${BASE_IMAGE} AS builder
ARG VARIANT=cpu
# where the CPU torch comes from: PyTorch's CPU index (a mirror or a local index works the same way)
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY docker/requirements-cpu.txt docker/requirements-gpu.txt /tmp/requirements/
# the dependencies first, in their own layer: a source change rebuilds only the layers below
RUN case "$VARIANT" in \
      cpu) pip install --no-deps "torch==2.13.0+cpu" --index-url "$TORCH_INDEX_URL" \
           && pip install -r /tmp/requirements/requirements-cpu.txt ;; \
      gpu) pip install -r /tmp/requirements/requirements-gpu.txt ;; \
      *) echo "VARIANT must be cpu or gpu, not $VARIANT" >&2; exit 2 ;; \
    esac
# the project itself: a pure-Python wheel of the packages pyproject.toml names (their data files included:
# the coordinator's dashboard page), built apart so a source change rebuilds neither the environment above
# nor the runtime's copy of it. It starts from the builder for its pip and setuptools (the locked set has
# them; a base image need not have pip), and builds offline with them (no build isolation)
FROM builder AS wheel
WORKDIR /src
COPY pyproject.toml ./
COPY shared ./shared
COPY services ./services
COPY engines ./engines
COPY cluster ./cluster
COPY simulator ./simulator
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .

FROM ${BASE_IMAGE}
WORKDIR /app
ENV PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PATH=/opt/venv/bin:$PATH
COPY --from=builder /opt/venv /opt/venv
# the wheel, installed (not editable) and nothing else: every dependency is in the locked set above
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-cache-dir --disable-pip-version-check --no-deps /tmp/wheels/relay_rl-*.whl \
    && rm -rf /tmp/wheels && pip check
# the run files compose and the chart point at (/app/configs/demo.toml); the working folder's configs/ is the
# services' default run file (configs/demo.toml)
COPY configs ./configs
# `relay-rl` (pyproject [project.scripts]) is on PATH: `docker run IMAGE relay-rl worker ...`
CMD ["relay-rl", "--help"]
