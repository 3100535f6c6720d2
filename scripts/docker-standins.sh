#!/usr/bin/env bash
# Stand-ins for the registry images the Dockerfile and docker-compose.yml name, for machines that
# can reach an apt mirror and PyPI but no image registry (docs/deployment.md). Built from Debian
# packages with debootstrap + docker import; an image that already exists is left alone.
#   DOCKER_HOST=unix://... scripts/docker-standins.sh
set -euo pipefail
DOCKER=${DOCKER:-/usr/bin/docker}       # Debian's 20.10 client: BuildKit without a buildx plugin
PY_IMAGE=python:3.11-slim-bookworm
PROM_IMAGE=prom/prometheus:v2.53.0

have() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

if ! have "$PY_IMAGE"; then
  # The machine's own Debian mirror (deb822 or one-line sources): the only one that is reachable.
  mirror=$(grep -rhoE '^URIs: *\S+|^deb +\S+' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
           | awk '{print $2}' | grep -E '/debian/?$' | head -n1 || true)
  root=$(mktemp -d /var/tmp/fleet-rootfs.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$root" "${mirror:-http://deb.debian.org/debian}" >/dev/null
  # The host's CA bundle (it may hold a proxy's CA that pip and apt inside builds must trust).
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$root/etc/pip.conf"
  ln -sf python3 "$root/usr/bin/python"
  ln -sf pip3 "$root/usr/bin/pip"
  # Like the official slim image: no docs, man pages, locales or apt lists.
  rm -rf "$root"/usr/share/{doc,man,info,locale}/* "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb "$root"/var/log/*.log
  tar -C "$root" -c . | "$DOCKER" import -c 'CMD ["python3"]' - "$PY_IMAGE" >/dev/null
  echo "built $PY_IMAGE (stand-in)"
fi

if ! have "$PROM_IMAGE"; then
  # Debian's Prometheus (2.42) behind the official image's entrypoint and paths.
  "$DOCKER" build --network host -t "$PROM_IMAGE" - >/dev/null <<'DOCKERFILE'
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /prometheus && chown nobody:nogroup /prometheus
USER nobody
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
DOCKERFILE
  echo "built $PROM_IMAGE (stand-in)"
fi
