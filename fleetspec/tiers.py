"""Infernet's VRAM tier enum and how a memory size maps onto it."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class VramTier(StrEnum):
    """Exactly the strings of Infernet's enum; order of declaration is order of size."""

    UNKNOWN = "unknown"
    LT_8GB = "<8gb"
    GB_8_16 = "8-16gb"
    GB_16_24 = "16-24gb"
    GB_24_48 = "24-48gb"
    GE_48GB = ">=48gb"


# Lower bounds in MiB, as Infernet computes them (8192 / 16384 / 24576 / 49152).
_THRESHOLDS: tuple[tuple[int, VramTier], ...] = (
    (49152, VramTier.GE_48GB),
    (24576, VramTier.GB_24_48),
    (16384, VramTier.GB_16_24),
    (8192, VramTier.GB_8_16),
    (0, VramTier.LT_8GB),
)
_RANK = {tier: i for i, tier in enumerate(VramTier)}


def tier_for_mib(total_mib: int | None) -> VramTier:
    """Tier of a GPU group whose memory adds up to ``total_mib``; None or 0 means unknown."""
    if not total_mib or total_mib <= 0:
        return VramTier.UNKNOWN
    for bound, tier in _THRESHOLDS:
        if total_mib >= bound:
            return tier
    return VramTier.UNKNOWN  # pragma: no cover - the 0 bound always matches


def largest_tier(tiers: Iterable[VramTier]) -> VramTier:
    """The node reports the largest tier of its instances (Infernet Book)."""
    return max(tiers, key=_RANK.__getitem__, default=VramTier.UNKNOWN)
