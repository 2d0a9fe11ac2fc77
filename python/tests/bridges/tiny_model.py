"""A model directory trainers can load offline, for the bridges' tests."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast


def tiny_model(path: Path) -> None:
    """A word-level tokenizer with a pad token and a tiny Llama config, no
    weights: the trainers' rollout sides read only the config and pad with
    the tokenizer (Polar calls the model)."""
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordLevel(vocab={"<pad>": 0, "<eos>": 1, "<unk>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    fast.save_pretrained(path)
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 65536, "hidden_size": 16,
        "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
        "max_position_embeddings": 8192, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 1,
    }
    (path / "config.json").write_text(json.dumps(config))
