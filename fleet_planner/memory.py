"""The memory a model needs: weights, KV cache, and a runtime overhead margin per GPU.

- weights  = parameters × bytes per parameter of the weight precision;
- KV cache = 2 (K and V) × layers × kv_heads × head_dim × bytes of the KV dtype, per token
  (MLA models: layers × (kv_lora_rank + qk_rope_head_dim) × bytes, one latent instead of K and V),
  × context × sequences. Every layer is counted at the full context, as vLLM sizes a cache without
  its hybrid allocator; a sliding-window lower bound is reported beside it;
- overhead = a fixed amount per GPU (default 2 GiB) for what vLLM's ``gpu_memory_utilization``
  budget holds besides weights and KV: the CUDA context and NCCL buffers (about 0.5 GiB), the
  activation peak of the profiling forward pass (about 1 GiB at the default batch-token limit)
  and the captured CUDA graphs (about 0.5 GiB).

Bytes are exact integers internally; GB in output means 10⁹ bytes, as in the published figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleet_planner.params import ParamCount
from fleet_planner.precision import Precision
from fleet_planner.shape import ModelShape

GIB = 1024**3
GB = 10**9
DEFAULT_OVERHEAD_GIB = 2.0


@dataclass(frozen=True)
class MemoryEstimate:
    shape: ModelShape
    params: ParamCount
    weight_precision: Precision
    kv_precision: Precision
    context: int
    seqs: int
    overhead_per_gpu: int  # bytes

    @property
    def weights(self) -> int:
        return math.ceil(self.params.total * self.weight_precision.bytes)

    @property
    def _kv_elements_per_layer_token(self) -> int:
        s = self.shape
        if s.mla is not None:
            return s.mla.kv_lora_rank + s.mla.qk_rope_head_dim
        return 2 * s.kv_heads * s.head_dim

    @property
    def kv_per_token(self) -> int:
        return math.ceil(self.shape.layers * self._kv_elements_per_layer_token * self.kv_precision.bytes)

    @property
    def kv_per_sequence(self) -> int:
        return self.kv_per_token * self.context

    @property
    def kv_cache(self) -> int:
        return self.kv_per_sequence * self.seqs

    @property
    def kv_cache_sliding(self) -> int | None:
        """KV when sliding-window layers keep only their window (vLLM's hybrid KV cache manager)."""
        s = self.shape
        if s.sliding_window is None or s.sliding_layers == 0:
            return None
        per_layer_token = self._kv_elements_per_layer_token * self.kv_precision.bytes
        tokens = (s.layers - s.sliding_layers) * self.context + s.sliding_layers * min(s.sliding_window, self.context)
        return math.ceil(per_layer_token * tokens * self.seqs)

    def total(self, gpus: int = 1) -> int:
        """Weights + KV + the overhead of ``gpus`` GPUs."""
        return self.weights + self.kv_cache + gpus * self.overhead_per_gpu

    def kv_shards(self, tp: int) -> int:
        """Into how many parts tensor parallelism splits the KV cache.

        TP ranks split the KV heads; past kv_heads ranks the heads are replicated, and MLA's
        latent is replicated on every rank."""
        if self.shape.mla is not None:
            return 1
        return min(tp, self.shape.kv_heads)

    def layer_share(self, pp: int) -> float:
        """The largest share of the layers one pipeline stage holds (vLLM splits as evenly as it can)."""
        return math.ceil(self.shape.layers / pp) / self.shape.layers

    def per_gpu(self, tp: int, pp: int, seqs: int | None = None) -> int:
        """Bytes the most loaded GPU of a tp × pp group needs for ``seqs`` sequences (default: all)."""
        share = self.layer_share(pp)
        kv = self.kv_per_sequence * (self.seqs if seqs is None else seqs)
        return math.ceil(self.weights * share / tp + kv * share / self.kv_shards(tp)) + self.overhead_per_gpu

    def seqs_that_fit(self, tp: int, pp: int, budget_per_gpu: int) -> int:
        """How many full-context sequences the KV room of one GPU of the group holds."""
        room = budget_per_gpu - self.per_gpu(tp, pp, seqs=0)
        per_seq = self.kv_per_sequence * self.layer_share(pp) / self.kv_shards(tp)
        return max(0, int(room // per_seq)) if per_seq > 0 else 0


def gb(n: float) -> float:
    return round(n / GB, 2)
