"""The tables the docs may embed, by marker name. The code they read is imported when a table is
rendered, not when this module is imported (the gateway pulls in FastAPI, prometheus, uvicorn).

| marker | renders |
|---|---|
| ``fleet-file`` | the fleet file's top-level keys (``fleetspec/fleetfile.py`` FleetFile) |
| ``fleet-file:PATH`` | the section at that dotted field path: ``gateway``, ``instances.sleep``, ... |
| ``gateway-settings`` | ``gateway/settings.py`` GatewaySettings as ``FLEET_*`` variables |
| ``metrics:gateway`` | ``gateway/metrics.py`` GatewayMetrics, with how each sums over workers |
| ``metrics:supervisor`` | ``fleet_supervisor/metrics.py`` FleetMetrics |
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from vllm_fleet.docgen.fields import FieldDoc, Section, constraints_text, default_text, describe, sections, type_text
from vllm_fleet.docgen.markdown import code, table
from vllm_fleet.docgen.metrics import metric_docs, metric_rows

FLEET_FILE = "fleet-file"
SETTINGS = "gateway-settings"


class UnknownTable(LookupError):
    pass


def fleet_sections() -> list[Section]:
    from fleetspec.fleetfile import FleetFile

    return sections(FleetFile)


def _field_rows(docs: list[FieldDoc]) -> list[list[str]]:
    return [[code(d.name), d.type, d.default, d.description] for d in docs]


def fleet_file_table(path: str) -> str:
    for s in fleet_sections():
        if s.path == path:
            return table(["key", "type", "default", "meaning"], _field_rows(list(describe(s.model, s.shown))))
    known = ", ".join(all_names())
    raise UnknownTable(f"fleet-file:{path}: the fleet file has no section at that path (tables: {known})")


def settings_fields() -> tuple[type[BaseModel], str, set[str]]:
    """GatewaySettings, its variable prefix, and the keys a fleet file's ``gateway:`` may set."""
    from fleetspec.fleetfile import GatewaySection
    from gateway.settings import GatewaySettings

    return GatewaySettings, str(GatewaySettings.model_config.get("env_prefix", "")), set(GatewaySection.model_fields)


def settings_table() -> str:
    model, prefix, in_file = settings_fields()
    rows = []
    for name, field in model.model_fields.items():
        file_key = code(f"gateway.{name}") if name in in_file else "–"
        bounds = constraints_text(field)
        kind = f"{type_text(field.annotation)}, {bounds}" if bounds else type_text(field.annotation)
        rows.append([code(prefix + name.upper()), default_text(field, unset="unset"), kind, file_key,
                     field.description or ""])
    return table(["variable", "default", "type", "fleet file key", "meaning"], rows)


def gateway_metrics_table() -> str:
    from gateway.metrics import GatewayMetrics

    m = GatewayMetrics()
    return table(["metric", "type", "labels", "help", "with several workers"],
                 metric_rows(metric_docs(m, m.registry), workers=True))


def supervisor_metrics_table() -> str:
    from fleet_supervisor.metrics import FleetMetrics

    m = FleetMetrics([])
    return table(["metric", "type", "labels", "help"], metric_rows(metric_docs(m, m.registry), workers=False))


_FIXED: dict[str, Callable[[], str]] = {
    SETTINGS: settings_table,
    "metrics:gateway": gateway_metrics_table,
    "metrics:supervisor": supervisor_metrics_table,
}


def all_names() -> list[str]:
    """Every table the code can render; each must appear in some doc (tests/test_docs.py)."""
    fleet = [FLEET_FILE + (f":{s.path}" if s.path else "") for s in fleet_sections()]
    return [*fleet, *_FIXED]


def render(name: str) -> str:
    if name == FLEET_FILE:
        return fleet_file_table("")
    if name.startswith(FLEET_FILE + ":"):
        return fleet_file_table(name.removeprefix(FLEET_FILE + ":"))
    if name in _FIXED:
        return _FIXED[name]()
    raise UnknownTable(f"no generated table named {name!r} (known: {', '.join(all_names())})")


def undescribed() -> list[str]:
    """Keys and variables whose code gives no ``Field(description=...)``: their rows would be blank."""
    missing = [d.name for s in fleet_sections() for d in describe(s.model, s.shown) if not d.description]
    model, prefix, _ = settings_fields()
    missing += [prefix + name.upper() for name, f in model.model_fields.items() if not f.description]
    return missing
