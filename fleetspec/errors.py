"""Configuration errors: one exception type, one exit code, a message that names the key."""

from __future__ import annotations

from pydantic import ValidationError

CONFIG_EXIT_CODE = 2


class ConfigError(Exception):
    """A config file or setting is wrong. ``str(err)`` names the file and the key."""

    exit_code = CONFIG_EXIT_CODE


def key_path(loc: tuple[int | str, ...]) -> str:
    """('instances', 1, 'gpus') -> 'instances[1].gpus'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def from_validation_error(source: str, err: ValidationError) -> ConfigError:
    """One line per problem, each starting with the dotted key it is about."""
    lines = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"  {key_path(loc)}: {msg}")
    return ConfigError(f"{source}: invalid configuration\n" + "\n".join(lines))
