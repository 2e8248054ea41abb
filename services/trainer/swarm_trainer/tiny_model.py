"""A tiny Llama-architecture model with a locally trained tokenizer, for tests and the demo.

Nothing here touches the network: the tokenizer is a byte-level BPE trained on a built-in
corpus, and the weights are random (seeded), saved in HF ``save_pretrained`` layout with
safetensors only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
# The trainer's own chat format (``swarm_trainer.data`` trains {"messages"} examples as
# "role: content" lines), so that serving a chat prompts a tuned model as it was trained.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Swarm is a decentralized cloud for fine-tuning language models.",
    "Question: What is the capital of France? Answer: Paris.",
    "Question: What is two plus two? Answer: Four.",
    "A LoRA adapter adds low-rank matrices to the attention projections.",
    "Workers send heartbeats; the scheduler places jobs on workers that fit.",
    "Checkpoints are saved to object storage so that training can resume elsewhere.",
    "user: hello there assistant: hi, how can I help you today?",
    "The weather is sunny today, with a light breeze from the west.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20.",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "Translate to French: cat -> chat, dog -> chien, house -> maison.",
]


def build_tokenizer(vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        # Every byte is in the alphabet, so any text encodes without <unk>.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(vocab_size: int = VOCAB_SIZE, **tokens: int | None) -> LlamaConfig:
    """The tiny Llama's architecture (``tokens``: its special token ids)."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        **tokens,
    )


def create_tiny_model(out_dir: Path, seed: int = 0) -> Path:
    """Write a tiny random Llama model and its tokenizer to ``out_dir``; return ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = tiny_config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m swarm_trainer.tiny_model OUT_DIR")
    print(create_tiny_model(Path(args[0])))


if __name__ == "__main__":
    main()
