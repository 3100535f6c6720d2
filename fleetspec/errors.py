"""Configuration errors: one exception type, one exit code, a message that names the key."""

from __future__ import annotations

import difflib
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

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


def from_validation_error(source: str, err: ValidationError, model: type[BaseModel] | None = None) -> ConfigError:
    """One line per problem, each starting with the dotted key it is about and ending with what to
    do: the value that was given, the key that was probably meant. ``model`` (the document's root
    model) lets an unknown key be answered with the keys allowed there."""
    lines = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"  {key_path(loc)}: {msg}{_hint(e['type'], loc, e.get('input'), model)}")
    return ConfigError(f"{source}: invalid configuration\n" + "\n".join(lines))


def _hint(kind: str, loc: tuple[int | str, ...], given: object, model: type[BaseModel] | None) -> str:
    if kind == "missing":
        return "; add this key"
    if kind == "extra_forbidden":
        allowed = _keys_at(model, loc[:-1]) if model is not None else []
        if not allowed:
            return "; remove this key"
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        meant = f"did you mean {close[0]}? " if close else ""
        return f"; unknown key, {meant}(keys here: {', '.join(allowed)})"
    if isinstance(given, str | int | float | bool) or given is None:
        return f"; got {given!r}"
    return ""


def _keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys the model allows at ``loc`` (list indices skipped), or [] where that is not a model."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        if current is None or part not in current.model_fields:
            return []
        current = _model_in(current.model_fields[part].annotation)
    return list(current.model_fields) if current is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, optional, or as list items."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
