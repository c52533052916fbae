# One image for every service and for a worker on any machine:
#   docker build -t relay-rl:0.1.0 .                              CPU: torch's CPU wheel (the demo, CPU workers)
#   docker build --build-arg VARIANT=gpu -t relay-rl:0.1.0-gpu .  GPU: vllm==0.33.0 and the CUDA torch it pins
# docker-compose.yml and the Helm chart (deploy/relay-rl) pick the command; a worker on another machine:
#   docker run --rm relay-rl:0.1.0 relay-rl worker --coordinator http://<host>:8000 --token=<join token>
# (add --gpus all and the -gpu tag for --engine vllm). Not built here: this machine has no Docker engine.
FROM python:3.11-slim
ARG VARIANT=cpu
WORKDIR /app
ENV PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
COPY pyproject.toml ./
COPY shared ./shared
COPY services ./services
COPY engines ./engines
COPY cluster ./cluster
COPY simulator ./simulator
COPY configs ./configs
# torch first and pinned, so no dependency can pull another build: the CPU wheel, or on the GPU variant
# the CUDA torch vllm pins. The `tasks` extra: the math and logic task adapters (docs/tasks.md).
RUN case "$VARIANT" in \
      cpu) pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
           && pip install --no-cache-dir -e ".[train,tasks]" ;; \
      gpu) pip install --no-cache-dir vllm==0.33.0 \
           && pip install --no-cache-dir -e ".[vllm,train,tasks]" ;; \
      *) echo "VARIANT must be cpu or gpu, not $VARIANT" >&2; exit 2 ;; \
    esac
# `relay-rl` (pyproject [project.scripts]) is on PATH: `docker run IMAGE relay-rl worker ...`
CMD ["relay-rl", "--help"]
