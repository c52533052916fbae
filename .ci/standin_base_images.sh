#!/usr/bin/env bash
# CI only: Docker Hub is unreachable from our CI machines, so the two base images the project's files name
# (python:3.11.14-slim-bookworm for the Dockerfile, redis:7.2-bookworm for docker-compose.yml) are built here as stand-ins from
# Debian bookworm (debootstrap, Debian's own mirror) and tagged with those names. A user's Docker pulls the
# real images; nothing in the Dockerfile or the compose file knows the difference:
#   python:3.11.14-slim-bookworm  Debian's python3 (3.11) with venv and headers, `python` on PATH, like the real slim image
#   redis:7.2-bookworm         Debian's redis-server (7.0), WORKDIR /data like the real image
# This machine's own CA certificates (/usr/local/share/ca-certificates: a TLS-inspecting egress proxy here) go
# into the stand-ins, and pip is pointed at the system bundle, so that pip inside a build reaches PyPI as
# the host's pip does. Skips the build when both tags exist. Needs root, debootstrap and a running Docker engine.
set -euo pipefail
if docker image inspect python:3.11.14-slim-bookworm >/dev/null 2>&1 && docker image inspect redis:7.2-bookworm >/dev/null 2>&1; then
  echo "stand-in base images already present"; exit 0
fi
root="$(mktemp -d /tmp/standin-root.XXXXXX)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,redis-server,ca-certificates \
  bookworm "$root" http://deb.debian.org/debian >/dev/null
ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null
fi
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/*
echo "deb http://deb.debian.org/debian bookworm main" > "$root/etc/apt/sources.list"
mkdir -p "$root/data"
tar -C "$root" -c . | docker import --change 'ENV LANG=C.UTF-8 PIP_CERT=/etc/ssl/certs/ca-certificates.crt' --change 'CMD ["python3"]' - python:3.11.14-slim-bookworm >/dev/null
docker tag python:3.11.14-slim-bookworm redis:7.2-bookworm
# redis:7.2-bookworm's own settings: its data folder and its command
docker build -q -t redis:7.2-bookworm - >/dev/null <<'DOCKERFILE'
FROM python:3.11.14-slim-bookworm
WORKDIR /data
CMD ["redis-server"]
DOCKERFILE
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^(python:3.11.14-slim-bookworm|redis:7.2-bookworm) '
