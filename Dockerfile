# One image for every service; docker-compose.yml picks the command.
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
COPY pyproject.toml ./
COPY shared ./shared
COPY services ./services
COPY engines ./engines
COPY cluster ./cluster
COPY configs ./configs
# torch first and pinned: the CPU build (never a CUDA build pulled in by a dependency).
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install --no-cache-dir -e ".[train]"
