"""Text of a growing token sequence, a piece per token, at a cost that does not grow.

Decoding every output token's whole sequence again costs O(n) a token (the tokenizer's
own per-id checks run in Python), O(n^2) a reply: a served stream spent more CPU on it
than on anything else it did, on the cores the decode steps need. Here each token decodes
a short window instead: the tokens since the last piece went out, after a few that came
before them, whose text is subtracted. The context matters: a SentencePiece token decoded
first loses its leading space, and a character split over tokens decodes to U+FFFD until
its last byte arrives (no piece is given until then).

The windows are decoded by the `tokenizers` library itself where transformers' decode would
only call it: on the default model's tokenizer, transformers' checks around each call cost
more than the decoding, and a stream pays them two or three times a token.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

CONTEXT = 4  # tokens decoded before the window only to be subtracted (see above)


def window_decoder(tokenizer) -> Callable[[list[int]], str]:
    """`tokenizer.decode(ids, skip_special_tokens=True)`, through the Rust tokenizer
    directly where that is all transformers does: a fast tokenizer whose class keeps
    transformers' decode and has no space clean-up to apply afterwards."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend as Fast
    except ImportError:  # transformers before 5
        from transformers import PreTrainedTokenizerFast as Fast
    cls, backend = type(tokenizer), getattr(tokenizer, "backend_tokenizer", None)
    plain = (
        isinstance(tokenizer, Fast)
        and backend is not None
        and cls.decode is PreTrainedTokenizerBase.decode
        and cls._decode is Fast._decode
        and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
    )
    decode = backend.decode if plain else tokenizer.decode
    return functools.partial(decode, skip_special_tokens=True)


class Detokenizer:
    def __init__(self, tokenizer):
        self._decode = window_decoder(tokenizer)
        self.ids: list[int] = []
        self.start = 0  # first token of the window's context
        self.read = 0  # tokens whose text has been given out
        self.done = ""  # the context's text: ids[start:read] decoded
        self.text = ""  # everything given out so far

    def push(self, token: int) -> str:
        """The new text that `token` completes ("" while a character is incomplete)."""
        self.ids.append(token)
        now = self._decode(self.ids[self.start :])
        if now.endswith("\ufffd"):  # a character split across tokens: wait for the rest
            return ""
        if not now.startswith(self.done):  # the tokenizer rewrote text across the boundary
            full = self._decode(self.ids)  # (clean-up rules): take the whole sequence's word
            piece = full[len(self.text) :] if full.startswith(self.text) else ""
        else:
            piece = now[len(self.done) :]
        self.read = len(self.ids)
        self.text += piece
        # The next context: CONTEXT tokens back, or up to 3 more so that it does not begin
        # inside a character (bytes of a character that byte fallback spelled out would
        # turn the next character's bytes into U+FFFD with them).
        self.start = max(self.read - CONTEXT, 0)
        self.done = self._decode(self.ids[self.start : self.read])
        while self.done.startswith("\ufffd") and self.start > max(self.read - CONTEXT - 3, 0):
            self.start -= 1
            self.done = self._decode(self.ids[self.start : self.read])
        return piece
