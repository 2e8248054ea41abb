"""A tiny Llama-architecture model with a locally trained tokenizer, for tests and the demo.

Nothing here touches the network. ``create_tiny_model``: a byte-level BPE trained on a
built-in corpus and random (seeded) weights, for tests that need a model fast.
``create_pretrained_model``: a character-level model pretrained by the trainer's own step on
a generated corpus (``synthetic``), so it knows something (copying, sums); deterministic from
its seed, about a minute on two CPU cores. Both are saved in HF ``save_pretrained`` layout
with safetensors only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
# The trainer's own chat format (``swarm_trainer.methods.sft`` trains {"messages"} examples as
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
    return _fast(tok)


def _fast(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """``tok`` as transformers loads it, with the special tokens and chat template."""
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


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte (a byte-level BPE without merges): a tiny model copies and reverses
    words letter by letter, which merged tokens would hide from it."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for char in sorted(alphabet):
        vocab[char] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return _fast(tok)


PRETRAIN_STEPS = 1200
PRETRAIN_BATCH = 32
PRETRAIN_LR = 3e-3
# Pretraining runs on one torch thread: the model's matmuls are too small for a second thread
# to pay, and where the cores are busy two threads spin-wait on each other (measured on a
# loaded 2-core VM: 200 steps in 30-46 s on one thread, 638 s and 10x the CPU time on two).
# The weights came out bit for bit those of a two-thread build there, so cached builds hold.
PRETRAIN_THREADS = 1


def pretrained_config(vocab_size: int, **tokens: int | None) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        **tokens,
    )


def create_pretrained_model(
    out_dir: Path, seed: int = 0, steps: int = PRETRAIN_STEPS, log: bool = True
) -> Path:
    """Pretrain a small Llama on ``synthetic.corpus`` with the trainer's own data pipeline,
    step and schedule (full weights, no adapter), and save it with its tokenizer; on
    ``PRETRAIN_THREADS`` threads, the caller's thread count restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(PRETRAIN_THREADS)
    try:
        return _pretrain(Path(out_dir), seed, steps, log)
    finally:
        torch.set_num_threads(threads)


def _pretrain(out_dir: Path, seed: int, steps: int, log: bool) -> Path:
    # Imported here: the random model needs none of the training code.
    from swarm_trainer.data import BatchSampler
    from swarm_trainer.methods.sft import tokenize
    from swarm_trainer.rng import seed_everything
    from swarm_trainer.step import lr_lambda, make_optimizer, train_step
    from swarm_trainer.synthetic import corpus

    seed_everything(seed)
    tokenizer = build_char_tokenizer()
    config = pretrained_config(
        len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    model.config.use_cache = False
    cpu = torch.device("cpu")
    examples = tokenize([{"text": t} for t in corpus(steps * 4, seed)], tokenizer, seq_len=96)
    sampler = BatchSampler(examples, PRETRAIN_BATCH, tokenizer.pad_token_id, seed)
    optimizer = make_optimizer(model.parameters(), PRETRAIN_LR, cpu)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(steps // 20, steps))
    model.train()
    started = time.monotonic()
    for step in range(steps):
        out = train_step(
            model, [sampler.batch(step)], optimizer, schedule, 1.0, cpu, select_logits=False
        )
        if log and (step + 1) % 100 == 0:
            took = time.monotonic() - started
            print(
                f"  pretraining step {step + 1}/{steps}: loss {out.loss:.3f} ({took:.0f} s)",
                flush=True,
            )
    model.eval()
    model.config.use_cache = True
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m swarm_trainer.tiny_model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--random", action="store_true", help="random weights (instant)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.random:
        print(create_tiny_model(args.out, args.seed))
    else:
        print(create_pretrained_model(args.out, args.seed))


if __name__ == "__main__":
    main()
