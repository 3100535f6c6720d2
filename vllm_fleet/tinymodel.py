"""A tiny Llama with random weights and a home-trained tokenizer: a real model for vLLM's CPU
build that needs no download (DESIGN §3). It answers nonsense, quickly, through every endpoint.

Shape constraints measured on the CPU build: head_dim must be 64 (head_dim 16 crashes the CPU
attention kernel), hence hidden 128 with 2 heads. torch, transformers and tokenizers are imported
inside the function so that importing this module stays cheap.

    python -m vllm_fleet.tinymodel DIR

The same generator makes bigger random-weight models for GPU runs, where the weight size is what
is measured (sleep and wake move the weights): ``vllm-fleet make-tiny-model DIR --hidden 3072
--layers 28 --heads 24 --kv-heads 8 --intermediate 8192 --dtype bfloat16 --device cuda`` is a
2.8 B-parameter Llama (5.6 GB), built on the GPU in seconds.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 512
MAX_POSITIONS = 2048
BOS, EOS, PAD = "<s>", "</s>", "<pad>"

# A simple role-tagged template; generation prompts end with the assistant tag.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A fleet of vLLM servers sits behind one OpenAI-compatible gateway.",
    "Each instance owns a group of GPUs and listens on its own port.",
    "The supervisor starts, watches, restarts and stops every process group.",
    "Hello! How can I help you today? Tell me a story about the sea.",
    "Once upon a time there was a small model that answered every question.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000, + - * / = ( ) [ ] { } < > : ; ' \" ? !",
    "system user assistant: you are a helpful assistant. Please reply briefly.",
    "Streaming responses arrive as server-sent events, one chunk at a time.",
    "Prometheus scrapes metrics; clients send chat completions and completions.",
]

# Files whose presence means a previous run finished (config is written last).
_MARKERS = ("tokenizer.json", "tokenizer_config.json", "model.safetensors", "config.json")


@dataclass(frozen=True)
class Shape:
    """The Llama's size. The default is the tiny one; head_dim = hidden / heads must stay 64 or more
    on the CPU build (16 crashes its attention kernel)."""

    hidden: int = 128
    layers: int = 2
    heads: int = 2
    kv_heads: int = 1
    intermediate: int = 256
    dtype: str = "float32"
    device: str = "cpu"  # where the random weights are made (cuda: seconds for billions of them)


def _complete(path: Path) -> bool:
    return all((path / name).is_file() for name in _MARKERS) or (
        (path / "config.json").is_file() and (path / "model.safetensors.index.json").is_file())


def make_tiny_model(directory: str, shape: Shape | None = None) -> str:
    """Write the tiny model and tokenizer into ``directory`` (created if needed); return its path.

    Idempotent: a directory that already holds a complete model is returned untouched.
    """
    path = Path(directory).resolve()
    if _complete(path):
        return str(path)
    path.mkdir(parents=True, exist_ok=True)
    # Build in a scratch directory inside the target and move the files in with config.json
    # last, so an interrupted run (or two concurrent ones) never leaves a "complete" half model.
    with tempfile.TemporaryDirectory(prefix=".tiny-", dir=path) as scratch:
        _build(Path(scratch), shape or Shape())
        names = sorted(p.name for p in Path(scratch).iterdir())
        names.sort(key=lambda n: n == "config.json")
        for name in names:
            (Path(scratch) / name).chmod(0o644)  # some writers create 0600 files
            os.replace(Path(scratch) / name, path / name)
    return str(path)


def _build(path: Path, shape: Shape) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    vocab_size = len(fast)

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.hidden // shape.heads,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        dtype=shape.dtype,
    )
    torch.manual_seed(SEED)
    with torch.device(shape.device):
        model = LlamaForCausalLM(config).to(getattr(torch, shape.dtype))  # type: ignore[no-untyped-call]
    fast.save_pretrained(str(path))
    model.save_pretrained(str(path), safe_serialization=True)
    # Tokenizer loaders differ on where they read the template; keep it in the config too.
    cfg_path = path / "tokenizer_config.json"
    tcfg = json.loads(cfg_path.read_text())
    tcfg.setdefault("chat_template", CHAT_TEMPLATE)
    cfg_path.write_text(json.dumps(tcfg, indent=2))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m vllm_fleet.tinymodel DIR", file=sys.stderr)
        return 2
    print(make_tiny_model(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
