"""Log-probabilities as OpenAI's two APIs give them, from the router's per-token
TokenLogprobs (the model's raw log-softmax: docs/design.md, The engine).

    completions: {"tokens": [str], "token_logprobs": [float], "top_logprobs": [{str: float}],
                  "text_offset": [int]}
    chat:        {"content": [{"token": str, "logprob": float, "bytes": [int],
                               "top_logprobs": [{"token", "logprob", "bytes"}]}]}

A token's string is its id decoded alone (special tokens shown); one that holds part of a
UTF-8 character decodes to U+FFFD, which is why chat gives `bytes` too (those of that
string: the tokenizer's own byte pieces are not exposed by every tokenizer).
"""

from __future__ import annotations

from typing import Any

from router.types import TokenLogprobs


class LogprobsFormat:
    """Turns tokens' logprobs into one endpoint's JSON, piece by piece."""

    def __init__(self, tokenizer: Any, chat: bool):
        self._tok = tokenizer
        self.chat = chat
        self._texts: dict[int, str] = {}
        """Token id -> its string, for this request (the same ids recur in the tops)."""

    def _text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = (self._tok.decode([token_id], skip_special_tokens=False)
                                            if self._tok is not None else str(token_id))
        return text

    def entry(self, token_id: int, lp: TokenLogprobs | None, offset: int) -> dict:
        """One token's entry (`offset`: where its text starts in the completion's)."""
        text = self._text(token_id)
        top = lp.top if lp is not None else ()
        if self.chat:
            return {"token": text, "logprob": lp.logprob if lp is not None else None, "bytes": list(text.encode()),
                    "top_logprobs": [{"token": self._text(i), "logprob": v, "bytes": list(self._text(i).encode())}
                                     for i, v in top]}
        return {"token": text, "logprob": lp.logprob if lp is not None else None,
                "top": {self._text(i): v for i, v in top}, "offset": offset}

    def block(self, entries: list[dict]) -> dict:
        """The `logprobs` object of a choice holding `entries`."""
        if self.chat:
            return {"content": entries}
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [e["top"] for e in entries], "text_offset": [e["offset"] for e in entries]}
