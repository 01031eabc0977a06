"""Make a small Hugging Face model directory and a JSONL corpus to try fine-tuning with, with
nothing downloaded: a byte-level BPE tokenizer trained on the corpus piebald ships (the help
topics of the Python documentation), and a randomly initialised Qwen2 or Llama (with Llama
3's RoPE scaling) saved by transformers, as a downloaded model directory would look.

    python examples/tiny_hf_model.py --out tiny-qwen2 --jsonl corpus.jsonl

Needs transformers and tokenizers (``pip install 'piebald[data]' transformers``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from piebald.runtime.data.corpus import corpus_text

EOS = "<|endoftext|>"


def documents() -> list[str]:
    """The shipped corpus cut into its help topics (blank-line separated blocks, merged up
    to about 2 KB each)."""
    blocks = [b.strip() for b in corpus_text().split("\n\n") if b.strip()]
    docs, current = [], ""
    for block in blocks:
        current = f"{current}\n\n{block}" if current else block
        if len(current) > 2000:
            docs.append(current)
            current = ""
    return [*docs, current] if current else docs


def train_tokenizer(texts: list[str], *, vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def random_model(family: str, *, vocab_size: int) -> transformers.PreTrainedModel:
    shape = {
        "num_hidden_layers": 4,
        "hidden_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 352,
        "vocab_size": vocab_size,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": True,
        "eos_token_id": 0,
        "bos_token_id": 0,
    }
    torch.manual_seed(0)
    if family == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**shape))
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
    }
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape, rope_parameters=rope))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the model directory to create")
    parser.add_argument("--family", choices=("qwen2", "llama"), default="qwen2")
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument(
        "--jsonl", type=Path, help="also write the corpus here, one document a line"
    )
    args = parser.parse_args()
    if args.out.exists() or (args.jsonl is not None and args.jsonl.exists()):
        parser.error(f"{args.out} or {args.jsonl} already exists; choose new paths")
    texts = documents()
    tokenizer = train_tokenizer(texts, vocab_size=args.vocab_size)
    model = random_model(args.family, vocab_size=tokenizer.get_vocab_size())
    model.save_pretrained(args.out)
    tokenizer.save(str(args.out / "tokenizer.json"))
    (args.out / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS}) + "\n")
    print(
        f"{args.out}: random {args.family} with {model.num_parameters():,} parameters, "
        f"tokenizer of {tokenizer.get_vocab_size()} tokens"
    )
    if args.jsonl is not None:
        with args.jsonl.open("w", encoding="utf-8") as f:
            for text in texts:
                f.write(json.dumps({"text": text}) + "\n")
        print(f"{args.jsonl}: {len(texts)} documents")


if __name__ == "__main__":
    main()
