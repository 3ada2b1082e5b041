"""Text on the router's side: the optional tokenizer and incremental detokenization.

The router tokenizes text prompts and attaches a text piece to each streamed
token when the configured model directory has a ``tokenizer.json``. Presets
(and directories without one) leave the router token-ids-only: text prompts
are rejected with INVALID_ARGUMENT and token pieces are empty.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

def load_tokenizer(model: str) -> Any | None:
    """The `tokenizers.Tokenizer` of checkpoint directory `model`, or None.

    None for an empty value, a preset name, or a directory without
    tokenizer.json. An existing path that is not a directory is an error.
    """
    if not model:
        return None
    path = Path(model)
    if not path.exists():
        log.info("model %r is not a directory; treating it as a preset (no tokenizer)", model)
        return None
    if not path.is_dir():
        raise ValueError(f"--model {model!r} is neither a checkpoint directory nor a preset name")
    tok_file = path / "tokenizer.json"
    if not tok_file.is_file():
        log.warning("%s has no tokenizer.json; text prompts will be rejected", path)
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tok_file))


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text`, with the tokenizer's special tokens (BOS) added."""
    return list(tokenizer.encode(text, add_special_tokens=True).ids)


class Detokenizer:
    """Turns a growing token list into text pieces, one call per token: tokenizers'
    own `DecodeStream`, which holds text back while it ends in a cut UTF-8 sequence,
    so each piece is valid text and the pieces concatenate to the decoding of the
    whole output."""

    def __init__(self, tokenizer: Any | None):
        self._tok = tokenizer
        self._stream = None
        if tokenizer is not None:
            from tokenizers.decoders import DecodeStream

            self._stream = DecodeStream(skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        """Append one token; returns the new text it completes (may be empty)."""
        if self._stream is None:
            return ""
        return self._stream.step(self._tok, token_id) or ""
