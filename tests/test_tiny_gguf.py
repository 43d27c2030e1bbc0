"""The tiny model the real-engine tests serve (tests/realtools/tiny_gguf.py), checked from the
written file with gguf's reader — no server needed: a llama architecture llama.cpp can load,
the sizes it claims, the character vocabulary, and the proof that end-of-sequence (and every
control or byte token) can never be sampled, so every request gets exactly its max_tokens."""

from __future__ import annotations

import numpy as np
import pytest

from tests.realtools import tiny_gguf as tg

pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tg.write(tmp_path_factory.mktemp("tiny") / "tiny.gguf", seed=0)
    meta, tensors = tg.read(path)
    return path, meta, tensors


@pytest.fixture(scope="module")
def margin(model):
    _, meta, t = model
    return tg.eos_margin_bound(t, tg.banned_ids(meta["tokenizer.ggml.token_type"]))


def test_the_file_is_a_llama_model_of_the_documented_size(model):
    path, meta, t = model
    assert meta["general.architecture"] == "llama"
    assert meta["llama.embedding_length"] == 512 and meta["llama.block_count"] == 4
    assert meta["llama.attention.head_count"] == 8 and meta["llama.attention.head_count_kv"] == 8
    assert meta["llama.feed_forward_length"] == 1536
    assert meta["llama.rope.dimension_count"] == 64 and meta["llama.context_length"] == 32768
    assert len(t) == 2 + 1 + 4 * 9
    assert t["token_embd.weight"].shape == (384, 512) and t["output.weight"].shape == (384, 512)
    for i in range(4):
        assert t[f"blk.{i}.attn_q.weight"].shape == (512, 512)
        assert t[f"blk.{i}.ffn_gate.weight"].shape == (1536, 512)
        assert t[f"blk.{i}.ffn_down.weight"].shape == (512, 1536)
    assert all(a.dtype == np.float32 for a in t.values())
    # 512·384·2 + 4·(4·512² + 3·512·1536 + 2·512) + 512 parameters, 4 bytes each, + header
    params = 512 * 384 * 2 + 4 * (4 * 512 ** 2 + 3 * 512 * 1536 + 2 * 512) + 512
    assert params * 4 < path.stat().st_size < params * 4 + 100_000
    assert 55e6 < path.stat().st_size < 57e6


def test_the_vocabulary_is_characters_with_byte_fallback(model):
    _, meta, _ = model
    tokens = meta["tokenizer.ggml.tokens"]
    assert len(tokens) == 384 == meta["llama.vocab_size"]
    assert meta["tokenizer.ggml.model"] == "llama"
    assert tokens[meta["tokenizer.ggml.eos_token_id"]] == "</s>"
    assert tokens[meta["tokenizer.ggml.bos_token_id"]] == "<s>"
    assert [tokens.index(f"<0x{b:02X}>") for b in (0, 255)] == [3, 258]
    assert {chr(c) for c in range(33, 127)} <= set(tokens) and "▁" in tokens
    types = meta["tokenizer.ggml.token_type"]
    assert sum(1 for k in types if k == 6) == 256          # byte tokens
    assert len(tg.banned_ids(types)) == 3 + 256


def test_end_of_sequence_can_never_win(model, margin):
    _, meta, _ = model
    banned = tg.banned_ids(meta["tokenizer.ggml.token_type"])
    assert meta["tokenizer.ggml.eos_token_id"] in banned
    # ≥ 50 logits below an allowed token for every input: P(EOS) < e^-50 at temperature 1, and
    # any min-p / top-k / greedy sampler drops it outright
    assert margin > 50


def _rms(x, g, eps=1e-5):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def _rope(x, heads):
    """llama.cpp's LLAMA_ROPE_TYPE_NORM: adjacent pairs rotated by pos·10000^(−2i/d)."""
    n, dim = x.shape
    hd = dim // heads
    x = x.reshape(n, heads, hd // 2, 2)
    theta = np.arange(n)[:, None] * 10000.0 ** (-np.arange(hd // 2) * 2.0 / hd)[None, :]
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = np.stack([x[..., 0] * c - x[..., 1] * s, x[..., 0] * s + x[..., 1] * c], axis=-1)
    return out.reshape(n, dim)


def _logits(t, ids):
    """A plain numpy forward pass of the llama architecture (causal attention, SwiGLU)."""
    h = t["token_embd.weight"][ids].astype(np.float64)
    n, heads = len(ids), 8
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(4):
        p = f"blk.{i}."
        a = _rms(h, t[p + "attn_norm.weight"])
        q, k, v = (_rope(a @ t[p + "attn_q.weight"].T, heads), _rope(a @ t[p + "attn_k.weight"].T, heads),
                   a @ t[p + "attn_v.weight"].T)
        hd = 512 // heads
        o = np.empty_like(q)
        for j in range(heads):
            sl = slice(j * hd, (j + 1) * hd)
            s = q[:, sl] @ k[:, sl].T / np.sqrt(hd) + mask
            w = np.exp(s - s.max(axis=1, keepdims=True))
            o[:, sl] = (w / w.sum(axis=1, keepdims=True)) @ v[:, sl]
        h = h + o @ t[p + "attn_output.weight"].T
        b = _rms(h, t[p + "ffn_norm.weight"])
        g = b @ t[p + "ffn_gate.weight"].T
        h = h + ((g / (1 + np.exp(-g))) * (b @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
    return _rms(h, t["output_norm.weight"]) @ t["output.weight"].T


def test_the_margin_holds_on_real_forward_passes(model, margin):
    """The bound is a bound: on actual hidden states every banned logit sits at least the
    proven margin below the best allowed one (and the model's choices vary: not one token)."""
    _, meta, t = model
    banned = tg.banned_ids(meta["tokenizer.ggml.token_type"])
    allowed = np.setdiff1d(np.arange(384), banned)
    rng = np.random.default_rng(1)
    picks = set()
    for n in (1, 7, 40):
        logits = _logits(t, rng.integers(0, 384, n))
        gap = logits[:, allowed].max(axis=1) - logits[:, banned].max(axis=1)
        assert np.all(gap >= margin), (gap.min(), margin)
        picks |= set(allowed[logits[:, allowed].argmax(axis=1)])
    assert len(picks) > 3


def test_a_model_that_could_emit_eos_is_refused(model):
    """The check can fail: an end-of-sequence row that is no longer pinned below its twin, or
    a layer that writes to the constant dimension, is named."""
    _, meta, t = model
    banned = tg.banned_ids(meta["tokenizer.ggml.token_type"])
    loose = dict(t)
    out = t["output.weight"].copy()
    out[2, 5] += 0.01
    loose["output.weight"] = out
    with pytest.raises(ValueError, match="row 2"):
        tg.eos_margin_bound(loose, banned)
    leaky = dict(t)
    wo = t["blk.3.attn_output.weight"].copy()
    wo[0, 0] = 1e-3
    leaky["blk.3.attn_output.weight"] = wo
    with pytest.raises(ValueError, match="blk.3.attn_output"):
        tg.eos_margin_bound(leaky, banned)


def test_the_writer_is_seeded(model):
    """The written file is the seed's weights, bit for bit; another seed differs."""
    _, _, t = model
    a = tg.weights(0)
    assert all(np.array_equal(a[k], t[k]) for k in a)
    assert not np.array_equal(tg.weights(1)["blk.0.attn_q.weight"], a["blk.0.attn_q.weight"])
