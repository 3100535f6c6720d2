"""Numeric precisions of weights and of the KV cache: bytes per element and vLLM's names."""

from __future__ import annotations

from enum import StrEnum

from fleetspec.errors import ConfigError


class Precision(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"

    @property
    def bytes(self) -> float:
        return _BYTES[self]

    @property
    def is_float(self) -> bool:
        """A compute dtype vLLM runs in (``--dtype``); the others are quantizations of the weights."""
        return self in (Precision.FP32, Precision.FP16, Precision.BF16)

    @property
    def vllm_dtype(self) -> str:
        """The ``--dtype`` value for a float precision."""
        return {Precision.FP32: "float32", Precision.FP16: "float16", Precision.BF16: "bfloat16"}[self]


_BYTES: dict[Precision, float] = {
    Precision.FP32: 4.0,
    Precision.FP16: 2.0,
    Precision.BF16: 2.0,
    Precision.FP8: 1.0,
    Precision.INT8: 1.0,
    Precision.INT4: 0.5,  # packed; group scales (about 3% at group size 128) are not counted
}

_ALIASES: dict[str, Precision] = {
    "fp32": Precision.FP32, "float32": Precision.FP32, "float": Precision.FP32,
    "fp16": Precision.FP16, "float16": Precision.FP16, "half": Precision.FP16,
    "bf16": Precision.BF16, "bfloat16": Precision.BF16,
    "fp8": Precision.FP8, "fp8_e4m3": Precision.FP8, "fp8_e5m2": Precision.FP8, "float8": Precision.FP8,
    "int8": Precision.INT8, "w8a8": Precision.INT8, "w8a16": Precision.INT8,
    "int4": Precision.INT4, "w4a16": Precision.INT4, "awq": Precision.INT4, "gptq": Precision.INT4,
}

CHOICES = ", ".join(p.value for p in Precision)


def parse_precision(text: str, where: str) -> Precision:
    """``where`` names the flag or config key the value came from, for the error message."""
    found = _ALIASES.get(text.strip().lower())
    if found is None:
        raise ConfigError(f"{where}: unknown precision {text!r}; expected one of {CHOICES}")
    return found


def precision_from_quantization(qc: dict[str, object]) -> Precision | None:
    """The weight precision a checkpoint's ``quantization_config`` declares, when it says."""
    bits = qc.get("bits", qc.get("w_bit", qc.get("weight_bits")))
    if isinstance(bits, int):
        return {4: Precision.INT4, 8: Precision.INT8}.get(bits)
    method = str(qc.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8", "compressed-tensors-fp8"):
        return Precision.FP8
    if method in ("awq", "gptq", "bitsandbytes_4bit"):
        return Precision.INT4
    return None
