"""The sleep level of each vLLM-mode sleeper on this host (the fleet file's ``level: auto``).

Level 1 parks the weights in host RAM: the fastest wake (DESIGN §3: 0.26 s to the first token for
a 2.8 B model) but the host must hold every sleeper's weights at once. Level 2 discards them and
reads them from disk on wake (0.97 s there). ``auto`` takes level 1 while the weights of all
level-1 sleepers fit in 80 % of the memory available now, and level 2 for the rest; ``check``
prints which and why.
"""

from __future__ import annotations

from pathlib import Path

from fleetspec.fleetfile import FleetFile, Instance

_HOST_FRACTION = 0.8  # leave room for the page cache, the gateway, vLLM's own host buffers
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def weights_bytes(model: str) -> int | None:
    """Bytes of weight files in a local model directory; None for a hub id (unknown here)."""
    path = Path(model)
    if not path.is_dir():
        return None
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and f.name.endswith(_WEIGHT_SUFFIXES))


def available_ram_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def sleep_levels(fleet: FleetFile, vllm_mode: list[Instance], ram: int | None) -> dict[str, tuple[int, str]]:
    """Instance name -> (level, why) for the instances that sleep through vLLM's sleep mode."""
    out: dict[str, tuple[int, str]] = {}
    room = None if ram is None else int(ram * _HOST_FRACTION)
    parked = 0
    for inst in vllm_mode:
        assert inst.sleep is not None
        size = weights_bytes(inst.model)
        if inst.sleep.level != "auto":
            level = int(inst.sleep.level)
            why = "set in the fleet file"
            if level == 1 and size is not None and room is not None and parked + size > room:
                why += f" (warning: level-1 sleepers' weights pass {_HOST_FRACTION:.0%} of the host's free RAM)"
            if level == 1:
                parked += size or 0
        elif size is None:
            level, why = 1, "auto: weights size unknown (not a local directory), assuming the host holds them"
        elif room is None or parked + size <= room:
            level, why = 1, f"auto: host RAM holds its {size / 2**30:.1f} GiB of weights while it sleeps"
            parked += size
        else:
            level, why = 2, (f"auto: its {size / 2**30:.1f} GiB of weights do not fit beside the other sleepers' in "
                             f"{_HOST_FRACTION:.0%} of the host's free RAM ({(ram or 0) / 2**30:.1f} GiB); "
                             "reloaded from disk on wake")
        out[inst.name] = (level, why)
    return out
