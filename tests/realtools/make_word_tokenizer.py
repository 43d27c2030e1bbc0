"""Build a word-level tokenizer (one whitespace word = one token) from AIPerf's own prompt corpus,
so the token count a load-test tool aims at equals queue_server's ``words`` rule (the byte-level
BPE of tests/fixtures/make_tokenizer.py splits Shakespeare into ~4.5 tokens a word: AIPerf's
"64-token" prompts then reach the server as ~14 words). Run with a Python that has `tokenizers`
and `transformers` (the /tmp/peers venv):

    /tmp/peers/bin/python tests/realtools/make_word_tokenizer.py \
        /tmp/peers/lib/python3.11/site-packages/aiperf/dataset/generator/assets/shakespeare.txt /tmp/qs/wtok
"""
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

corpus, out = sys.argv[1], sys.argv[2]
tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")   # joins the words back with spaces
tok.train([corpus], trainers.WordLevelTrainer(vocab_size=60000, special_tokens=["<unk>", "<|endoftext|>"]))
f = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                            bos_token="<|endoftext|>", unk_token="<unk>")
f.save_pretrained(out)
ids = f("the quick brown fox")["input_ids"]
print(len(ids), repr(f.decode(ids)))
