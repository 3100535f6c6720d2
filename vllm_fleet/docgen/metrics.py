"""Metric names, types, labels and help texts, read from a live metrics object's own registry.

The gateway and the supervisor each keep their metrics in a private ``CollectorRegistry`` (no
global state), so the generator builds one object of each and asks its registry what it holds:
a metric added to either class appears in the docs without touching this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from vllm_fleet.docgen.markdown import code

# prometheus_client's multiprocess modes, as an operator reads them with several gateway workers.
_ACROSS_WORKERS = {
    "livesum": "sum over live workers",
    "sum": "sum over all workers",
    "livemax": "max over live workers",
    "max": "max over all workers",
    "livemin": "min over live workers",
    "min": "min over all workers",
    "liveall": "one series per live worker",
    "all": "one series per worker",
    "mostrecent": "the last value written",
    "livemostrecent": "the last value written by a live worker",
}


@dataclass(frozen=True)
class MetricDoc:
    name: str  # as it appears in /metrics: counters with _total, histograms by their base name
    type: str
    labels: tuple[str, ...]
    help: str
    across_workers: str


def _wrappers(owner: object) -> dict[str, MetricWrapperBase]:
    """The metric objects an instance holds as attributes, by family name."""
    found: dict[str, MetricWrapperBase] = {}
    for value in vars(owner).values():
        if isinstance(value, MetricWrapperBase):
            for family in value.describe():
                found[family.name] = value
    return found


def _type_text(name: str, kind: str, wrapper: MetricWrapperBase | None) -> str:
    bounds: list[float] = list(getattr(wrapper, "_upper_bounds", []))
    finite = [b for b in bounds if b != float("inf")]
    if kind == "histogram" and finite:
        unit = " s" if name.endswith("_seconds") else ""
        return f"histogram, buckets {finite[0]:g} … {finite[-1]:g}{unit}"
    return kind


def _across(kind: str, wrapper: MetricWrapperBase | None) -> str:
    if kind in ("counter", "histogram", "summary"):
        return "sum over all workers, dead ones included"
    mode = str(getattr(wrapper, "_multiprocess_mode", "all"))
    return _ACROSS_WORKERS.get(mode, mode)


def metric_docs(owner: object, registry: CollectorRegistry) -> list[MetricDoc]:
    """Every family in ``registry``; labels from ``owner``'s metric attributes (a family that has
    no attribute and no sample yet cannot show its labels: that is an error, not a guess)."""
    wrappers = _wrappers(owner)
    out: list[MetricDoc] = []
    for family in registry.collect():
        wrapper = wrappers.get(family.name)
        if wrapper is not None:
            labels = tuple(getattr(wrapper, "_labelnames", ()))
        elif family.samples:
            labels = tuple(family.samples[0].labels)
        else:
            raise LookupError(f"metric {family.name}: not an attribute of {type(owner).__name__}, labels unknown")
        name = family.name + "_total" if family.type == "counter" else family.name
        out.append(MetricDoc(name, _type_text(family.name, family.type, wrapper), labels, family.documentation,
                             _across(family.type, wrapper)))
    return out


def metric_rows(docs: Iterable[MetricDoc], workers: bool) -> list[list[str]]:
    rows = []
    for d in docs:
        row = [code(d.name), d.type, ", ".join(code(label) for label in d.labels) or "–", d.help]
        rows.append([*row, d.across_workers] if workers else row)
    return rows
