"""What a pydantic field looks like to someone writing a config: its type in words, its default as
they would write it, its bounds and its description. Read from the models, never restated."""

from __future__ import annotations

import enum
import json
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from vllm_fleet.docgen.markdown import code


@dataclass(frozen=True)
class FieldDoc:
    name: str
    type: str
    default: str
    description: str  # empty when the code gives none (tests/test_docs.py refuses that)


def _choices(values: list[Any]) -> str:
    return " / ".join(code(_scalar(v)) for v in values)


def _scalar(v: Any) -> str:
    """A value as it is written in YAML or in a variable: true, null, 0.9, 900 (not 900.0)."""
    if isinstance(v, enum.Enum):
        v = v.value
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, str | int | float):
        return str(v)
    return json.dumps(_plain(v), separators=(", ", ": "))


def _plain(v: Any) -> Any:
    if isinstance(v, BaseModel):
        return v.model_dump(mode="json")
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


def type_text(annotation: Any) -> str:
    """``int | None`` -> 'integer / `null`'; ``Literal['a', 'b']`` -> '`a` / `b`'."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        inner = " / ".join(type_text(a) for a in args)
        return f"{inner} / `null`" if len(args) < len(get_args(annotation)) else inner
    if origin is Literal:
        return _choices(list(get_args(annotation)))
    if origin is list:
        inner = type_text(get_args(annotation)[0])
        plural = {"section", "string", "integer", "number", "boolean"}
        return f"list of {inner}s" if inner in plural else f"list of {inner}"
    if origin is dict:
        key, value = get_args(annotation)
        return f"map of {type_text(key)} to {type_text(value)}"
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return _choices([m.value for m in annotation])
        if issubclass(annotation, BaseModel):
            return "section"
        names = {bool: "boolean", int: "integer", float: "number", str: "string"}
        if annotation in names:
            return names[annotation]
    return str(annotation)


def constraints_text(field: FieldInfo) -> str:
    """Bounds pydantic enforces, in the order a reader checks them."""
    out: list[str] = []
    for m in field.metadata:
        if isinstance(m, at.Ge):
            out.append(f"≥ {_scalar(m.ge)}")
        elif isinstance(m, at.Gt):
            out.append(f"> {_scalar(m.gt)}")
        elif isinstance(m, at.Le):
            out.append(f"≤ {_scalar(m.le)}")
        elif isinstance(m, at.Lt):
            out.append(f"< {_scalar(m.lt)}")
        elif isinstance(m, at.MinLen):
            out.append("not empty" if m.min_length == 1 else f"at least {m.min_length} long")
        elif isinstance(m, at.MaxLen):
            out.append(f"at most {m.max_length} long")
        elif getattr(m, "pattern", None):
            out.append(f"matching {code(str(m.pattern))}")
    return ", ".join(out)


def default_value(field: FieldInfo) -> Any:
    """The default (a factory called), or PydanticUndefined for a required field."""
    return field.get_default(call_default_factory=True, validated_data={})


def default_text(field: FieldInfo, unset: str = "`null`") -> str:
    """``unset`` names what None and '' mean where they mean "not set" (variables: unset)."""
    value = default_value(field)
    if value is PydanticUndefined:
        return "**required**"
    if isinstance(value, BaseModel):
        return "its defaults"
    if value is None or value == "":
        return unset
    return code(_scalar(value))


def describe(model: type[BaseModel], prefix: str = "") -> Iterator[FieldDoc]:
    """One FieldDoc per field of ``model``, keys shown as ``prefix + name``."""
    for name, field in model.model_fields.items():
        kind = type_text(field.annotation)
        bounds = constraints_text(field)
        yield FieldDoc(prefix + name, f"{kind}, {bounds}" if bounds else kind, default_text(field),
                       field.description or "")


def nested_model(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """The model a field holds (directly, optionally or as a list), and whether it is a list."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        for a in get_args(annotation):
            found = nested_model(a)
            if found:
                return found
        return None
    if origin is list:
        inner = nested_model(get_args(annotation)[0])
        return (inner[0], True) if inner else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None


@dataclass(frozen=True)
class Section:
    path: str  # dotted field names, the marker's argument: "" (the file), "instances", "instances.sleep"
    shown: str  # how its keys are written in the docs and in error messages: "instances[].sleep."
    model: type[BaseModel]


def sections(root: type[BaseModel]) -> list[Section]:
    """``root`` and every model reachable from it through its fields, depth first."""
    out: list[Section] = []

    def walk(model: type[BaseModel], path: str, shown: str) -> None:
        out.append(Section(path, shown, model))
        for name, field in model.model_fields.items():
            found = nested_model(field.annotation)
            if found:
                sub, is_list = found
                walk(sub, f"{path}.{name}" if path else name, f"{shown}{name}{'[]' if is_list else ''}.")

    walk(root, "", "")
    return out
