"""Routing policy names: the contract between the fleet file, FLEET_ROUTING_* and the gateway."""

from __future__ import annotations

from enum import StrEnum


class Policy(StrEnum):
    ROUND_ROBIN = "round_robin"
    LEAST_IN_FLIGHT = "least_in_flight"
    LOAD_AWARE = "load_aware"
    PREFIX_AWARE = "prefix_aware"


# Policies that read each backend's /metrics (so the gateway runs its load scraper).
SCRAPING = frozenset({Policy.LOAD_AWARE, Policy.PREFIX_AWARE})
