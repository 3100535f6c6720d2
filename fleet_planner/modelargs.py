"""The planner's command-line flags, shared by ``plan`` and ``up --model``.

``--model`` may be given several times: the models then run side by side on this node, each on a
GPU group of its own (``fleet_planner.placement``). A flag that describes a model (its shape,
``--dtype``, ``--kv-dtype``, ``--context``, ``--seqs``, ``--served-name``, ``--asleep``) applies
to the ``--model`` before it; given before the first ``--model`` it applies to every model. So
``--model M --context 4096`` and ``--context 4096 --model M`` mean the same, as they always did.
The node's flags (``--gpus``, ``--nodes``, ``--gpu-memory-utilization``, ...) apply wherever they
stand. Only argparse is imported here: the CLI builds its parser without loading the planner.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelArg:
    """One ``--model`` and the model flags given after it."""

    model: str
    options: dict[str, Any] = field(default_factory=dict)


class AddModel(argparse.Action):
    """``--model``: starts a new model entry; ``args.model`` stays the first one given."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        models = [*(getattr(namespace, "models", None) or []), ModelArg(str(values))]
        namespace.models = models
        if getattr(namespace, self.dest, None) is None:
            setattr(namespace, self.dest, str(values))


class ModelFlag(argparse.Action):
    """A model flag: for the ``--model`` before it; before any, the default of every model."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        value = self.const if self.nargs == 0 else values
        models: list[ModelArg] | None = getattr(namespace, "models", None)
        if models:
            models[-1].options[self.dest] = value
        elif self.nargs == 0:
            parser.error(f"{option_string}: give it after the --model it describes")
        else:
            setattr(namespace, self.dest, value)
            namespace.every_model = {*(getattr(namespace, "every_model", None) or ()), self.dest}


# The per-model flags' destinations (PlanRequest fields, plus asleep).
MODEL_FLAGS = ("params", "layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "intermediate", "dtype",
               "kv_dtype", "context", "seqs", "served_name", "asleep")


def add_plan_arguments(p: argparse.ArgumentParser, model_required: bool) -> None:
    p.set_defaults(models=None, every_model=None)
    p.add_argument("--model", required=model_required, default=None, action=AddModel,
                   help="local model directory or config.json; or a model id, with the shape given by the flags "
                        "below. Give it several times to run several models side by side, each on its own GPU "
                        "group; the model flags after a --model describe that model")
    m = p.add_argument_group("model flags (for the --model before them; before the first --model: every model)",
                             "The shape flags (--params, --layers, ... --intermediate) override or replace "
                             "config.json.")
    m.add_argument("--params", action=ModelFlag,
                   help="parameter count, e.g. 7e9, 7B, 70b (default: counted from the shape)")
    for flag in ("layers", "hidden", "heads", "kv-heads", "head-dim", "vocab", "intermediate"):
        m.add_argument(f"--{flag}", type=int, default=None, action=ModelFlag)
    m.add_argument("--dtype", action=ModelFlag,
                   help="weight precision: fp32, fp16, bf16, fp8, int8, int4 (default: from the config)")
    m.add_argument("--kv-dtype", action=ModelFlag,
                   help="KV cache precision: auto (the compute dtype, default), fp8, fp16, bf16, fp32")
    m.add_argument("--context", type=int, default=8192, action=ModelFlag,
                   help="tokens per sequence (--max-model-len); default 8192")
    m.add_argument("--seqs", type=int, default=16, action=ModelFlag,
                   help="concurrent sequences at full context; default 16")
    m.add_argument("--served-name", action=ModelFlag,
                   help="served model name (default: the model id or directory name)")
    m.add_argument("--asleep", action=ModelFlag, nargs=0, const=True, default=False,
                   help="with several --model: this model shares the GPU group of the awake --model before it, "
                        "asleep until a request for it (a sleep: block; docs/sleep.md)")
    n = p.add_argument_group("node flags (anywhere on the line)")
    n.add_argument("--gpus", help="GPUs of one node, e.g. 8x80GB (sizes in GiB); default: this host's, from NVML")
    n.add_argument("--nodes", type=int, default=1, help="nodes with --gpus each; default 1")
    n.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vLLM's budget per GPU; default 0.9")
    n.add_argument("--overhead-gib", type=float, default=2.0,
                   help="runtime overhead per GPU (CUDA context, activations, CUDA graphs); default 2")
    n.add_argument("--replicas", type=int, default=None, help="at most this many data-parallel replicas (one model)")
    n.add_argument("--fleet-file", help="where to write the planned fleet file")


def model_values(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each model's flags: the defaults (and flags before the first --model), then its own."""
    defaults = {k: getattr(args, k) for k in MODEL_FLAGS}
    return [{**defaults, **m.options, "model": m.model} for m in (args.models or [])]


_LOAD_FLAGS = ("context", "seqs", "kv_dtype", "dtype")


def last_model_only(args: argparse.Namespace) -> list[str]:
    """Notes on load flags that only the last of several models got: at the end of the line they
    read as meant for every model, but they describe the --model before them."""
    models: list[ModelArg] = args.models or []
    if len(models) < 2:
        return []
    every = args.every_model or set()
    notes = []
    for dest in _LOAD_FLAGS:
        if dest in models[-1].options and dest not in every and all(dest not in m.options for m in models[:-1]):
            flag = "--" + dest.replace("_", "-")
            notes.append(f"{flag} {models[-1].options[dest]} applies to {models[-1].model} only (the --model before "
                         f"it); give it before the first --model to plan every model with it")
    return notes
