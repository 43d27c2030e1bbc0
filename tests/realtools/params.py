"""The service-time model shared by the server and the truth simulator: only the parameters and
the two service-time formulas, never an event loop, so the two implementations stay independent.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class EngineParams:
    """A continuous-batching replica: ``slots`` sequence slots held from prefill start to the
    last token; decode iterations that emit one token to every decoding sequence. All service
    times are multiplied by ``time_scale``.

    ``prefill_lane``: ``"single"`` — one prefill lane beside the decode lane (a prompt takes
    ``prefill_ms``); ``"chunked"`` — no lane: the prompts admitted at an iteration's start are
    computed inside it, which then takes ``decode_step_ms(decoding + new prompts) +
    prefill_base_ms + prefill_ms_per_token × their prompt tokens`` (the first tokens at its end)."""

    slots: int = 32
    prefill_base_ms: float = 30.0
    prefill_ms_per_token: float = 0.5
    decode_base_ms: float = 20.0
    decode_ms_per_seq: float = 2.0
    time_scale: float = 1.0
    default_max_tokens: int = 32
    prefill_lane: str = "single"

    def __post_init__(self):
        if self.prefill_lane not in ("single", "chunked"):
            raise ValueError(f"prefill_lane must be 'single' or 'chunked', not {self.prefill_lane!r}")

    def chunk_ms(self, prompt_tokens: int) -> float:
        """What the prompts computed in one iteration add to it (chunked prefill)."""
        return (self.prefill_base_ms + self.prefill_ms_per_token * prompt_tokens) * self.time_scale

    def prefill_ms(self, prompt_tokens: int) -> float:
        """Service time of one prefill on the single prefill lane."""
        return (self.prefill_base_ms + self.prefill_ms_per_token * prompt_tokens) * self.time_scale

    def decode_step_ms(self, batch: int) -> float:
        """Duration of one decode iteration over ``batch`` decoding sequences."""
        return (self.decode_base_ms + self.decode_ms_per_seq * batch) * self.time_scale

    def with_(self, **kw) -> "EngineParams":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return asdict(self)


def count_prompt_tokens(text: str, rule: str = "words") -> int:
    """The server's prompt-token count of ``text`` (no tokenizer is needed in the main env).

    ``words``: whitespace-separated words (what a word-level tokenizer would give);
    ``chars4``: ceil(characters / 4), the usual "4 characters a token" rule. At least 1."""
    if rule == "words":
        return max(1, len(text.split()))
    if rule == "chars4":
        return max(1, math.ceil(len(text) / 4))
    raise ValueError(f"unknown token rule {rule!r} (words, chars4)")


#: The reference replica of the issue: 64-token prompts, 32-token answers.
REFERENCE = EngineParams()
#: A small, fast replica for CI: fewer slots, so the slot limit binds at a few req/s and runs of
#: 20-30 s settle quickly.
SMALL = EngineParams(slots=8)
#: The reference replica with its prompts chunked into the decode iterations (no prefill lane).
CHUNKED = EngineParams(prefill_lane="chunked")
