"""The Infernet-style daemon config JSON (DESIGN §2), both shapes, and the normalized backend
list that the gateway serves from.

Shape 1: ``{"backend": "vllm", "vllm_host": URL, "vllm_model": NAME, "vram_tier": TIER}``
Shape 2: ``{"backend": "vllm", "vllm_instances": [{"host": URL, "model": NAME}, ...],
"served_models": [...]}``

Instances in shape 2 may carry more than the Book's two keys; vllm-fleet writes and reads
``name``, ``models`` (every served name), ``vram_tier``, ``gpu_memory_mib`` and ``max_num_seqs``
(the most sequences its vLLM runs at once: the gateway's default concurrency limit for it). Unknown top-level
keys are ignored: the file is the daemon's config too and carries its own settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fleetspec.errors import ConfigError, from_validation_error
from fleetspec.fleetfile import FleetFile, Instance, arg_value
from fleetspec.tiers import VramTier, largest_tier, tier_for_mib


@dataclass
class BackendSpec:
    """One upstream OpenAI-compatible server. Empty ``models`` means: ask its /v1/models."""

    name: str
    url: str
    models: list[str] = field(default_factory=list)
    vram_tier: VramTier = VramTier.UNKNOWN
    max_num_seqs: int | None = None


class InfernetInstance(BaseModel):
    model_config = ConfigDict(extra="ignore")
    host: str = Field(pattern=r"^https?://[^/\s]+(/.*)?$")
    model: str | None = None
    models: list[str] = Field(default_factory=list)
    name: str | None = None
    vram_tier: VramTier | None = None
    gpu_memory_mib: int | None = Field(None, ge=0)
    max_num_seqs: int | None = Field(None, ge=1)


class InfernetConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    backend: Literal["vllm"] = "vllm"
    vllm_host: str | None = Field(None, pattern=r"^https?://[^/\s]+(/.*)?$")
    vllm_model: str | None = None
    vram_tier: VramTier | None = None
    vllm_instances: list[InfernetInstance] | None = None
    served_models: list[str] | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> InfernetConfig:
        if self.vllm_host is None and not self.vllm_instances:
            raise ValueError("needs either vllm_host or a non-empty vllm_instances")
        if self.vllm_host is not None and self.vllm_instances:
            raise ValueError("give vllm_host or vllm_instances, not both")
        return self


def _strip(url: str) -> str:
    return url.rstrip("/")


def parse_infernet(data: dict[str, Any], source: str = "infernet config") -> tuple[list[BackendSpec], VramTier | None]:
    """Backends and the node tier override (None: compute it from the backends)."""
    try:
        cfg = InfernetConfig.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(source, e, InfernetConfig) from e
    if cfg.vllm_host is not None:
        models = [cfg.vllm_model] if cfg.vllm_model else []
        tier = cfg.vram_tier or VramTier.UNKNOWN
        return [BackendSpec("backend-0", _strip(cfg.vllm_host), models, tier)], cfg.vram_tier
    specs: list[BackendSpec] = []
    seen: set[str] = set()
    for i, inst in enumerate(cfg.vllm_instances or []):
        url = _strip(inst.host)
        if url in seen:
            raise ConfigError(f"{source}: vllm_instances[{i}].host: {url} is listed twice; list each backend once "
                              "(one entry may serve several models: give them in models)")
        seen.add(url)
        models = list(dict.fromkeys(inst.models or ([inst.model] if inst.model else [])))
        tier = inst.vram_tier or tier_for_mib(inst.gpu_memory_mib)
        specs.append(BackendSpec(inst.name or f"backend-{i}", url, models, tier, inst.max_num_seqs))
    return specs, cfg.vram_tier


def backends_from_fleet(fleet: FleetFile, gpu_memory_mib: dict[int, int]) -> list[BackendSpec]:
    """What a fleet file will serve once the supervisor has started it."""
    out = []
    for inst in fleet.instances:
        mem = sum(gpu_memory_mib.get(g, 0) for g in inst.gpus) if inst.gpus else 0
        known = bool(inst.gpus) and all(g in gpu_memory_mib for g in inst.gpus)
        tier = inst.vram_tier or (tier_for_mib(mem) if known else VramTier.UNKNOWN)
        per_gpu = [gpu_memory_mib[g] for g in inst.gpus if g in gpu_memory_mib]
        out.append(BackendSpec(inst.name, inst.url, list(inst.names), tier,
                               max_num_seqs(inst, min(per_gpu) if per_gpu else None)))
    return out


def max_num_seqs(inst: Instance, gpu_mib: int | None) -> int | None:
    """The most sequences the instance's vLLM runs at once: ``--max-num-seqs`` when its arguments
    set it, else vLLM's own default for its server as vLLM 0.24–0.32 choose it (engine/arg_utils:
    1,024 on GPUs of 70 GiB and more but the A100, 256 on smaller ones, 128 per rank on the CPU
    build); None when that cannot be told (the GPU's memory is unknown, or a non-vLLM command)."""
    value = arg_value(inst.vllm_args, "--max-num-seqs")
    if value is not None:
        return int(value) if value.isdigit() and int(value) > 0 else None
    if inst.device == "cpu":
        return 128 * inst.tp * inst.pipeline_parallel_size
    if gpu_mib is None:
        return None
    return 1024 if gpu_mib >= 70 * 1024 else 256


def node_tier(specs: list[BackendSpec], override: VramTier | None) -> VramTier:
    return override or largest_tier(s.vram_tier for s in specs)


def render_infernet(specs: list[BackendSpec], override: VramTier | None = None) -> dict[str, Any]:
    """The multi-instance shape, with vllm-fleet's extra per-instance keys."""
    served = list(dict.fromkeys(m for s in specs for m in s.models))
    return {
        "backend": "vllm",
        "vram_tier": node_tier(specs, override).value,
        "vllm_instances": [
            {"name": s.name, "host": s.url, "model": s.models[0] if s.models else None,
             "models": s.models, "vram_tier": s.vram_tier.value,
             **({"max_num_seqs": s.max_num_seqs} if s.max_num_seqs else {})}
            for s in specs
        ],
        "served_models": served,
    }
