"""A tiny llama-architecture GGUF with random weights for the real-engine tests (llama-server).

    python -m tests.realtools.tiny_gguf OUT.gguf [--seed 0]

512 hidden, 4 layers, 8 heads, feed-forward 1536, f32 (≈ 56 MB): big enough that a decode step
costs a few ms on one CPU core and grows with the batch, small enough to write in seconds. The
vocabulary (384 entries) is character-level SentencePiece ("llama" tokenizer) with byte fallback:
<unk>, <s>, </s>, the 256 byte tokens, "▁" (space), the 94 printable ASCII characters and 30
common bigrams, so any prompt tokenizes and a prompt's token count is about its length in chars.

The model must answer with exactly ``max_tokens`` tokens, each one character, whatever the client
asks — so end-of-sequence (and every control or byte token) can never be sampled. Built in:

* residual dimension 0 is a constant ``CONST_DIM0`` in every token embedding and no layer writes
  to it (row 0 of ``attn_output`` and ``ffn_down`` is zero; the layers' norms ignore it), so after
  the final RMS norm it is strictly positive for every input;
* the output row of every banned token is the row of an allowed token ("a") minus
  ``BAN_WEIGHT`` on dimension 0, so its logit is that token's minus ``BAN_WEIGHT`` × (normed dim 0):
  always lower, and by a margin ``eos_margin_bound`` proves from the weights' norms alone
  (≈ 110 logits for seed 0: with any sampler, P(end-of-sequence) < e⁻¹⁰⁰).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HIDDEN = 512
LAYERS = 4
HEADS = 8
FFN = 1536
CONTEXT = 32768
RMS_EPS = 1e-5
WEIGHT_STD = 0.02
CONST_DIM0 = 100.0
BAN_WEIGHT = 200.0
BIGRAMS = ("▁t", "th", "he", "in", "er", "an", "re", "on", "▁a", "en", "at", "ou", "ed", "ha",
           "to", "or", "it", "is", "hi", "es", "ng", "▁s", "▁w", "▁o", "▁i", "nd", "ti", "te",
           "st", "ar")
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2

# gguf token types (llama.cpp's llama_token_type)
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    scores: list[float]
    types: list[int]

    @property
    def allowed_ids(self) -> np.ndarray:
        """The tokens the model may emit: the normal (one- or two-character) ones."""
        return np.array([i for i, t in enumerate(self.types) if t == _NORMAL])


def vocab() -> Vocab:
    """The 384-entry character vocabulary with byte fallback (see the module docstring)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [_UNKNOWN, _CONTROL, _CONTROL] + [_BYTE] * 256
    chars = ["▁"] + [chr(c) for c in range(33, 127)]
    tokens += chars + list(BIGRAMS)
    types += [_NORMAL] * (len(chars) + len(BIGRAMS))
    # SentencePiece merges the highest-scoring pair first; single characters never merge
    scores = [0.0] * (3 + 256) + [-1000.0] * len(chars) + [-1.0 - i for i in range(len(BIGRAMS))]
    assert len(tokens) == 384 and len(set(tokens)) == 384
    return Vocab(tokens, scores, types)


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    """All tensors by GGUF name, numpy shape (out, in) as GGUF/llama.cpp expect (float32)."""
    rng = np.random.default_rng(seed)
    v = vocab()
    n_vocab = len(v.tokens)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * WEIGHT_STD).astype(np.float32)

    norm_skip0 = np.ones(HIDDEN, np.float32)
    norm_skip0[0] = 0.0                      # the layers do not see the constant dimension
    emb = rng.standard_normal((n_vocab, HIDDEN)).astype(np.float32)
    emb[:, 0] = CONST_DIM0
    t: dict[str, np.ndarray] = {"token_embd.weight": emb}
    for i in range(LAYERS):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm_skip0.copy()
        t[p + "attn_q.weight"] = mat(HIDDEN, HIDDEN)
        t[p + "attn_k.weight"] = mat(HIDDEN, HIDDEN)
        t[p + "attn_v.weight"] = mat(HIDDEN, HIDDEN)
        wo = mat(HIDDEN, HIDDEN)
        wo[0, :] = 0.0                       # nothing writes to the constant dimension
        t[p + "attn_output.weight"] = wo
        t[p + "ffn_norm.weight"] = norm_skip0.copy()
        t[p + "ffn_gate.weight"] = mat(FFN, HIDDEN)
        t[p + "ffn_up.weight"] = mat(FFN, HIDDEN)
        wd = mat(HIDDEN, FFN)
        wd[0, :] = 0.0
        t[p + "ffn_down.weight"] = wd
    t["output_norm.weight"] = np.ones(HIDDEN, np.float32)
    out = (rng.standard_normal((n_vocab, HIDDEN)) * 0.1).astype(np.float32)
    out[:, 0] = 0.0
    anchor = v.tokens.index("a")
    banned = np.setdiff1d(np.arange(n_vocab), v.allowed_ids)
    out[banned] = out[anchor]
    out[banned, 0] = -BAN_WEIGHT
    t["output.weight"] = out
    return t


def read(path: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """The metadata (key → value) and the tensors (name → array, numpy shape (out, in)) of a
    GGUF file, through the gguf package's reader."""
    import gguf

    r = gguf.GGUFReader(str(path))
    meta = {}
    for key, f in r.fields.items():
        try:
            meta[key] = f.contents()
        except Exception:  # noqa: BLE001 — a field type the reader cannot decode: not ours
            continue
    return meta, {t.name: np.asarray(t.data) for t in r.tensors}


def banned_ids(types) -> np.ndarray:
    """Every token that is not a normal character token: end-of-sequence, control, byte."""
    return np.array([i for i, k in enumerate(types) if int(k) != _NORMAL])


def eos_margin_bound(t: dict[str, np.ndarray], banned) -> float:
    """A lower bound, from the weights alone, on how far below some allowed token's logit every
    banned token's logit lies, for every input; raises ValueError naming the broken part when
    the construction (module docstring) does not hold.

    The final residual is h = (c0, rest) with c0 the constant embedding dimension; RMS-normed,
    dimension 0 is c0·√d / √(c0² + |rest|²) (ε only shrinks the denominator's effect: ignored,
    the bound is for ε = 0 and ε > 0 increases it). |rest| ≤ max |embedding rest| + Σ layers of
    attention ‖W_o‖·√heads·‖W_v‖·A and feed-forward ‖W_down‖·‖W_gate‖·‖W_up‖·A², where A = √d ·
    max|norm weight| bounds an RMS-normed vector (attention mixes values convexly per head;
    |silu(x)| ≤ |x|). Loose, but a proof.
    """
    d = t["token_embd.weight"].shape[1]
    emb = t["token_embd.weight"]
    c0 = float(emb[0, 0])
    if not (c0 > 0 and np.all(emb[:, 0] == c0)):
        raise ValueError("token_embd.weight: dimension 0 is not one positive constant")
    layers = sorted({k.split(".")[1] for k in t if k.startswith("blk.")}, key=int)
    for i in layers:
        for name in ("attn_output", "ffn_down"):
            if np.any(t[f"blk.{i}.{name}.weight"][0] != 0):
                raise ValueError(f"blk.{i}.{name}.weight writes to dimension 0 (row 0 not zero)")
    g0 = float(t["output_norm.weight"][0])
    if not g0 > 0:
        raise ValueError("output_norm.weight[0] is not positive")
    out = t["output.weight"]
    allowed = np.setdiff1d(np.arange(out.shape[0]), banned)
    gaps = []
    for b in banned:
        same = allowed[np.all(out[allowed, 1:] == out[b, 1:], axis=1)]
        if len(same) == 0:
            raise ValueError(f"output.weight row {b} (banned) matches no allowed row "
                             "outside dimension 0")
        gaps.append(float(np.max(out[same, 0]) - out[b, 0]))
    if min(gaps) <= 0:
        raise ValueError("output.weight: a banned row is not below its allowed twin on dimension 0")
    # the structure holds; now the size of everything else in the residual
    spec = lambda m: float(np.linalg.norm(m.astype(np.float64), 2))  # noqa: E731
    rest = float(np.max(np.linalg.norm(emb[:, 1:].astype(np.float64), axis=1)))
    for i in layers:
        p = f"blk.{i}."
        a_attn = np.sqrt(d) * float(np.max(np.abs(t[p + "attn_norm.weight"])))
        a_ffn = np.sqrt(d) * float(np.max(np.abs(t[p + "ffn_norm.weight"])))
        heads = HEADS
        rest += spec(t[p + "attn_output.weight"]) * np.sqrt(heads) * spec(t[p + "attn_v.weight"]) * a_attn
        rest += (spec(t[p + "ffn_down.weight"]) * spec(t[p + "ffn_gate.weight"])
                 * spec(t[p + "ffn_up.weight"]) * a_ffn ** 2)
    normed0 = c0 * np.sqrt(d) / np.sqrt(c0 ** 2 + rest ** 2) * g0
    return min(gaps) * normed0


def write(path: str | Path, seed: int = 0) -> Path:
    """Write the model to ``path`` (a temporary name first, then renamed)."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    v = vocab()
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(f"capplan tiny random llama (seed {seed})")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_vocab_size(len(v.tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(v.tokens)
    w.add_token_scores(v.scores)
    w.add_token_types(v.types)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    for name, arr in weights(seed).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    p = write(a.out, a.seed)
    print(f"{p} ({p.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
