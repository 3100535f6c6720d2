"""Reading a config document (YAML or JSON) from disk, with errors that exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from fleetspec.errors import ConfigError


def load_document(path: str | Path) -> dict[str, Any]:
    """Parse ``path`` as JSON when it ends in .json, else as YAML (a superset of JSON)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config file: {e.strerror or e}; check the path given to "
                          "-c/--config") from e
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {e}\n  fix the syntax at the "
                          "line shown (a file ending in .json is read as JSON, any other as YAML)") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: (top level): expected a mapping, got {type(data).__name__}; a fleet file maps "
                          "instances: (and more keys) to values, an Infernet config has vllm_host or vllm_instances")
    return data


def is_fleet_document(data: dict[str, Any]) -> bool:
    """A fleet file has ``instances``; the Infernet shapes have ``vllm_host``/``vllm_instances``."""
    return "instances" in data
