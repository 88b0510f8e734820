"""Makes the tiny model the real-engine tests serve: run with the vLLM environment's Python
(`python tests/tinymodel.py DIR`), since it needs transformers and tokenizers, which the
exporter's environment does not carry.

No model hub is reachable here, so the model is made, not downloaded: a random 2-layer
Llama (hidden 128, 2 heads of 64: the CPU attention kernels refuse a head_dim of 16) and
a byte-level BPE tokenizer trained on text shaped like the prompts the tests send, with a
chat template. The weights are random, so what it generates is noise; the prefix cache
does not care: it hashes the prompt's token ids. Deterministic: the same seed and
corpus make the same files, and MARK names what was made so a cached copy is reused.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

MARK = "tiny-llama-v2"  # bump when what is made changes: a cached model of another mark is made again
VOCAB = 512
LORA = "lora-support-bot"  # the adapter's folder inside the model's

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus() -> list[str]:
    words = ("You are a helpful assistant for an online store. Answer questions about orders, returns, shipping, "
             "payments and accounts. Current date and time: 2026-12-07 17:42:13. Customer question: where is my order "
             "number 0123456789? The quick brown fox jumps over the lazy dog. system user assistant tenant policy")
    lines = [words]
    for i in range(200):
        lines.append(f"Current date and time: 2026-12-{i % 28 + 1:02d} {i % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d}. "
                     f"Request {i}: please check order {i * 7919 % 100000}.")
    return lines


def tokenizer():
    """The model's byte-level BPE tokenizer (the `tokenizers` package, a test extra: no torch needed)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    return tok


def make(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
                         torch_dtype="float32")
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    _lora(out / LORA, config)
    (out / "MARK").write_text(MARK + "\n")


def _lora(out: Path, config) -> None:
    """A LoRA adapter in PEFT's layout (rank 8 on q_proj and v_proj), random: vLLM keys a
    request's cache blocks by its adapter, so the same prompt through it shares no block
    with the base model's."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    rank, width = 8, config.hidden_size
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for proj in ("q_proj", "v_proj"):
            key = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, width) * 0.01
            tensors[f"{key}.lora_B.weight"] = torch.randn(width, rank) * 0.01
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 16, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"], "bias": "none", "base_model_name_or_path": str(out.parent)}))


def ready(out: Path) -> bool:
    mark = out / "MARK"
    return mark.exists() and mark.read_text().strip() == MARK


if __name__ == "__main__":
    target = Path(sys.argv[1])
    if not ready(target):
        make(target)
    print(json.dumps({"model": str(target), "mark": MARK}))
