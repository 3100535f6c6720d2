"""Turns the gateway's config file (Infernet JSON of either shape, or a fleet file) into backends."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetspec.documents import is_fleet_document, load_document
from fleetspec.fleetfile import parse_fleet
from fleetspec.gpus import discover_gpus
from fleetspec.infernet import BackendSpec, backends_from_fleet, parse_infernet
from fleetspec.tiers import VramTier


@dataclass
class GatewayConfig:
    backends: list[BackendSpec]
    node_tier: VramTier | None  # None: the largest backend tier
    settings: dict[str, Any]  # the file's gateway settings; FLEET_* variables override them


def load_gateway_config(path: str | Path) -> GatewayConfig:
    data = load_document(path)
    if is_fleet_document(data):
        fleet = parse_fleet(data, str(path))
        needs_gpus = any(inst.gpus and inst.vram_tier is None for inst in fleet.instances)
        memory = {g.index: g.memory_total_mib for g in discover_gpus()} if needs_gpus else {}
        return GatewayConfig(backends_from_fleet(fleet, memory), fleet.vram_tier, fleet.gateway.model_dump())
    specs, tier = parse_infernet(data, str(path))
    return GatewayConfig(specs, tier, {})
