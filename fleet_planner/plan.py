"""The capacity plan: from a request (model, precision, load, GPUs) to memory, fit, layout,
replicas, VRAM tier and notes. ``fleet_planner.fleetdoc`` turns it into a fleet file and
``fleet_planner.report`` into a table or JSON."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleet_planner.hardware import Hardware, from_discovered, parse_gpus
from fleet_planner.layout import Fit, budget_per_gpu, smallest_fit
from fleet_planner.memory import DEFAULT_OVERHEAD_GIB, GIB, MemoryEstimate, gb
from fleet_planner.params import count_params
from fleet_planner.precision import Precision, parse_precision
from fleet_planner.shape import ModelShape, config_path, load_shape
from fleetspec.errors import ConfigError
from fleetspec.gpus import Gpu
from fleetspec.tiers import VramTier, tier_for_mib

# The published measurement behind the replica advice (cited in the plan's notes).
SMALL_MODEL_EVIDENCE = ("a published measurement had a 7B model at 843 tok/s on 1 A100 but only 651 tok/s with "
                        "TP=4: a model that fits one GPU serves more as data-parallel replicas than sharded")


@dataclass(frozen=True)
class PlanRequest:
    model: str
    params: str | None = None  # "7e9", "7B", "70b"
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    vocab: int | None = None
    intermediate: int | None = None
    dtype: str | None = None  # default: the config's quantization, else torch_dtype, else bf16
    kv_dtype: str | None = None  # default: the compute dtype
    context: int = 8192
    seqs: int = 16
    gpus: str | None = None  # "8x80GB"; None = NVML
    nodes: int = 1
    gpu_memory_utilization: float = 0.9
    overhead_gib: float = DEFAULT_OVERHEAD_GIB
    replicas: int | None = None  # at most this many; default as many as fit
    served_name: str | None = None


@dataclass(frozen=True)
class CapacityPlan:
    request: PlanRequest
    model_path: str  # what the fleet file passes as --model
    served_name: str
    memory: MemoryEstimate
    compute_dtype: Precision
    hardware: Hardware
    fit: Fit | None
    replicas: int
    tier: VramTier
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.fit is not None

    @property
    def single_node(self) -> bool:
        return self.fit is not None and self.fit.layout.nodes == 1


_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str, flag: str = "--params") -> int:
    """'7e9', '7B', '70b', '1.5T', '560M' -> the count."""
    t = text.strip().lower().replace("_", "")
    mult = _SUFFIX.get(t[-1:]) if t[-1:].isalpha() else 1.0
    try:
        value = float(t[:-1] if t[-1:].isalpha() else t) * mult if mult is not None else 0.0
    except ValueError:
        value = 0.0
    if not 1 <= value < 1e16:
        raise ConfigError(f"{flag}: cannot read {text!r}; expected a positive count such as 7e9, 7B or 70b")
    return int(value)


def _positive(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"{name}: must be positive, got {value}")


def _check_request(r: PlanRequest) -> None:
    for flag, value in (("--layers", r.layers), ("--hidden", r.hidden), ("--heads", r.heads),
                        ("--kv-heads", r.kv_heads), ("--head-dim", r.head_dim), ("--vocab", r.vocab),
                        ("--intermediate", r.intermediate), ("--context", r.context), ("--seqs", r.seqs),
                        ("--nodes", r.nodes), ("--replicas", r.replicas)):
        _positive(flag, value)
    if not 0 < r.gpu_memory_utilization <= 1:
        raise ConfigError(f"--gpu-memory-utilization: must be in (0, 1], got {r.gpu_memory_utilization}")
    if r.overhead_gib < 0:
        raise ConfigError(f"--overhead-gib: must not be negative, got {r.overhead_gib}")


def _shape_from_flags(r: PlanRequest) -> ModelShape:
    missing = [f for f, v in (("--layers", r.layers), ("--hidden", r.hidden), ("--heads", r.heads)) if v is None]
    if r.params is None:
        missing += [f for f, v in (("--vocab", r.vocab), ("--intermediate", r.intermediate)) if v is None]
    if missing:
        raise ConfigError(f"--model: {r.model!r} is not a local directory or config.json, so the shape comes from "
                          f"the command line; missing {', '.join(missing)} (or --params instead of --vocab and "
                          f"--intermediate)")
    assert r.layers and r.hidden and r.heads
    return ModelShape(layers=r.layers, hidden=r.hidden, heads=r.heads, kv_heads=r.kv_heads or r.heads,
                      head_dim=r.head_dim or r.hidden // r.heads, vocab=r.vocab or 0, intermediate=r.intermediate)


def resolve_shape(r: PlanRequest) -> tuple[ModelShape, str]:
    """The shape, and the model as the fleet file should name it."""
    path = config_path(r.model)
    if path is None and (r.model.endswith(".json") or r.model.startswith(("/", "./", "../", "~"))):
        raise ConfigError(f"--model: {r.model}: no such file or directory")
    if path is None:
        shape = _shape_from_flags(r)
        model_path = r.model
    else:
        shape = load_shape(path)
        model_path = str(path.parent if path.name.endswith(".json") else path)
    overrides = {"layers": r.layers, "hidden": r.hidden, "heads": r.heads, "kv_heads": r.kv_heads,
                 "head_dim": r.head_dim, "vocab": r.vocab, "intermediate": r.intermediate,
                 "params": parse_count(r.params) if r.params is not None else None}
    given = {k: v for k, v in overrides.items() if v is not None}
    if path is not None and given:
        note = "from the command line over the config: " + ", ".join(f"{k}={v}" for k, v in given.items())
        shape = shape.with_overrides(**given, notes=(*shape.notes, note))
    else:
        shape = shape.with_overrides(**given)
    return shape, model_path


def _precisions(r: PlanRequest, shape: ModelShape) -> tuple[Precision, Precision, Precision]:
    """Weight precision, compute dtype (vLLM --dtype) and KV cache precision."""
    weights = (parse_precision(r.dtype, "--dtype") if r.dtype else
               shape.quantization or shape.torch_dtype or Precision.BF16)
    compute = weights if weights.is_float else (
        shape.torch_dtype if shape.torch_dtype and shape.torch_dtype.is_float else Precision.BF16)
    kv = parse_precision(r.kv_dtype, "--kv-dtype") if r.kv_dtype and r.kv_dtype != "auto" else compute
    if kv in (Precision.INT8, Precision.INT4):
        raise ConfigError(f"--kv-dtype: vLLM's KV cache takes auto, fp8 or a float dtype, not {r.kv_dtype}")
    return weights, compute, kv


def model_notes(mem: MemoryEstimate) -> list[str]:
    """What the plan says of the model itself, whatever GPUs it gets."""
    shape = mem.shape
    notes = list(shape.notes)
    if shape.moe is not None:
        notes.append(f"MoE: {shape.moe.experts} experts, {shape.moe.experts_per_token} per token; every expert's "
                     f"weights are resident ({gb(mem.weights):.1f} GB) though {mem.params.active / 1e9:.1f} B "
                     "parameters are active per token")
    sliding = mem.kv_cache_sliding
    if sliding is not None:
        notes.append(f"{shape.sliding_layers} of {shape.layers} layers use a {shape.sliding_window}-token sliding "
                     f"window; with vLLM's hybrid KV cache manager the KV cache needs about {gb(sliding):.2f} GB "
                     f"instead of {gb(mem.kv_cache):.2f} GB (this plan counts the full context on every layer)")
    if mem.weight_precision in (Precision.INT4, Precision.INT8) and shape.quantization is None:
        notes.append(f"{mem.weight_precision} weights need a pre-quantized checkpoint (AWQ, GPTQ, "
                     "compressed-tensors); vLLM reads its quantization_config")
    if shape.max_position is not None and mem.context > shape.max_position:
        notes.append(f"--context {mem.context} exceeds the model's {shape.max_position} positions "
                     "(max_position_embeddings): vLLM refuses that --max-model-len; lower --context")
    return notes


def _notes(plan: CapacityPlan, hw: Hardware, util: float) -> list[str]:
    mem, fit, shape = plan.memory, plan.fit, plan.memory.shape
    notes = model_notes(mem)
    if fit is None:
        need1 = mem.total(1)
        notes.append(f"does not fit: even all {hw.total_gpus} GPUs at gpu_memory_utilization {util} are too small "
                     f"(one GPU would need {gb(need1):.1f} GB); lower --context/--seqs, quantize, or add GPUs")
        return notes
    lay = fit.layout
    if lay.tp > 1 and shape.mla is None and lay.tp > shape.kv_heads:
        notes.append(f"TP={lay.tp} exceeds the {shape.kv_heads} KV heads: each GPU holds a replicated KV head")
    if lay.pp > lay.nodes:
        alt = smallest_fit(mem, hw, util, tp_only=True)
        if alt is not None and alt.layout.gpus != lay.gpus:
            notes.append(f"a tensor-parallel alternative: {alt.layout.gpus} GPUs with TP={alt.layout.tp} "
                         "(lower latency than PP, at the cost of more GPUs)")
    odd = smallest_fit(mem, hw, util, tiling=False)
    if odd is not None and odd.layout.gpus < lay.gpus:
        notes.append(f"{odd.layout.gpus} GPUs would also fit (TP={odd.layout.tp} x PP={odd.layout.pp}), but that "
                     f"size does not divide the {hw.gpus_per_node} GPUs of a node, so it would leave GPUs idle")
    if plan.replicas > 1 and lay.gpus == 1:
        notes.append(f"{plan.replicas} data-parallel replicas of one GPU each rather than one TP={plan.replicas} "
                     f"instance: {SMALL_MODEL_EVIDENCE}")
    elif plan.replicas > 1:
        notes.append(f"{plan.replicas} data-parallel replicas of {lay.gpus} GPUs each fill the node; the gateway "
                     "balances requests across them")
    if lay.nodes > 1:
        notes.append(f"the layout spans {lay.nodes} nodes (vLLM over a Ray cluster); vllm-fleet runs one host, "
                     "so no fleet file is written")
    if fit.seqs_at_full_context < plan.request.seqs:  # pragma: no cover - fit implies room for all seqs
        notes.append("fewer sequences fit than requested")
    return notes


@dataclass(frozen=True)
class Estimate:
    """What a model needs, before any GPU is chosen."""

    memory: MemoryEstimate
    compute_dtype: Precision
    model_path: str  # what the fleet file passes as --model
    served_name: str


def estimate(r: PlanRequest) -> Estimate:
    _check_request(r)
    shape, model_path = resolve_shape(r)
    weights, compute, kv = _precisions(r, shape)
    mem = MemoryEstimate(shape=shape, params=count_params(shape), weight_precision=weights, kv_precision=kv,
                         context=r.context, seqs=r.seqs, overhead_per_gpu=int(r.overhead_gib * GIB))
    served = r.served_name or (Path(model_path).name if config_path(r.model) else r.model)
    return Estimate(mem, compute, model_path, served)


def hardware_for(r: PlanRequest, discover: Callable[[], list[Gpu]]) -> Hardware:
    """``--gpus``, else what ``discover`` (NVML, in the CLI) finds."""
    return parse_gpus(r.gpus, r.nodes) if r.gpus is not None else from_discovered(discover(), r.nodes)


def make_plan(r: PlanRequest, discover: Callable[[], list[Gpu]]) -> CapacityPlan:
    """``discover`` is consulted only when ``r.gpus`` is None (NVML, in the CLI)."""
    est = estimate(r)
    mem, compute, model_path = est.memory, est.compute_dtype, est.model_path
    hw = hardware_for(r, discover)
    fit = smallest_fit(mem, hw, r.gpu_memory_utilization)
    replicas = 0
    tier = VramTier.UNKNOWN
    if fit is not None:
        replicas = hw.gpus_per_node // fit.layout.gpus if fit.layout.nodes == 1 else 1
        replicas = min(replicas, r.replicas) if r.replicas else replicas
        tier = tier_for_mib(hw.memory_mib * fit.layout.gpus)  # the group's combined memory (DESIGN §2)
    plan = CapacityPlan(request=r, model_path=model_path, served_name=est.served_name, memory=mem,
                        compute_dtype=compute, hardware=hw, fit=fit, replicas=replicas, tier=tier)
    plan.notes.extend(_notes(plan, hw, r.gpu_memory_utilization))
    return plan


__all__ = ["CapacityPlan", "Estimate", "PlanRequest", "budget_per_gpu", "estimate", "hardware_for", "make_plan",
           "model_notes", "parse_count"]
