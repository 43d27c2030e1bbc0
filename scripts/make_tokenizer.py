"""Train a tiny byte-level BPE tokenizer and save it as a Hugging Face tokenizer directory
(tokenizer.json, tokenizer_config.json), so AIPerf, GuideLLM, vLLM bench serve and
inference-perf can run offline (no hub download): pass the directory as their tokenizer.

Needs ``tokenizers`` and ``transformers`` (the peer-tools venv has both:
scripts/peer_tools.sh). Deterministic: the same arguments give the same tokenizer.

    python scripts/make_tokenizer.py OUT_DIR [--vocab-size 400] [--seed 0]

It is the tokenizer the real peer fixtures under tests/fixtures/ were produced with
(defaults: vocabulary 400, seed 0); tests/fixtures/make_tokenizer.py calls it.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "token", "model",
         "serving", "latency", "capacity", "plan", "gpu", "request"]


def make_tokenizer(out_dir: str | Path, *, vocab_size: int = 400, seed: int = 0) -> Path:
    """Train the tokenizer and save it to ``out_dir`` (created); returns the directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rnd = random.Random(seed)
    corpus = [" ".join(rnd.choice(WORDS) for _ in range(50)) for _ in range(500)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>", unk_token="<|endoftext|>")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--vocab-size", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    out = make_tokenizer(a.out_dir, vocab_size=a.vocab_size, seed=a.seed)
    print(out)


if __name__ == "__main__":
    main()
