"""Text on the router's side: the optional tokenizer and incremental detokenization.

The router tokenizes text prompts and attaches a text piece to each streamed
token when it has a tokenizer: a checkpoint directory's ``tokenizer.json``, or a
preset's own (runtime/engine/preset_tokenizer.py, so the embedded default serves
text too). A directory without one leaves the router token-ids-only: text prompts
are rejected with INVALID_ARGUMENT and token pieces are empty.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def load_tokenizer(model: str) -> Any | None:
    """The `tokenizers.Tokenizer` of `model`: a checkpoint directory's tokenizer.json, or
    a preset's (`name` or `name@seed`) own; None for an empty value, a directory without
    tokenizer.json, or a name that is neither (the workers judge the model; the router only
    tokenizes). An existing path that is not a directory is an error.

    A preset's is built in code (runtime/engine/preset_tokenizer.py), without torch: the
    engine package imports it only where it computes (runtime/engine/__init__.py)."""
    if not model:
        return None
    path = Path(model)
    if not path.exists():
        return _preset_tokenizer(model)
    if not path.is_dir():
        raise ValueError(f"--model {model!r} is neither a checkpoint directory nor a preset name")
    tok_file = path / "tokenizer.json"
    if not tok_file.is_file():
        log.warning("%s has no tokenizer.json; text prompts will be rejected", path)
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tok_file))


def preset_of(model: str) -> Any | None:
    """The ModelConfig of the preset `model` names (`name` or `name@seed`), or None."""
    from runtime.engine.presets import PRESETS

    return PRESETS.get(model.partition("@")[0])


def _preset_tokenizer(model: str) -> Any | None:
    from runtime.engine.preset_tokenizer import preset_tokenizer
    from runtime.engine.presets import PRESETS

    cfg = preset_of(model)
    if cfg is None:
        log.warning("model %r is neither a directory nor a preset %s; no tokenizer", model, sorted(PRESETS))
        return None
    return preset_tokenizer(cfg)


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
        self._ids: list[int] = []
        self._given = 0
        """Characters of text given out so far."""
        self._holding = False
        """The last step gave nothing: bytes may be held. DecodeStream gives text only once
        what it decoded so far ends in a whole character, and then gives all of it."""
        if tokenizer is not None:
            from tokenizers.decoders import DecodeStream

            self._stream = DecodeStream(skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        """Append one token; returns the new text it completes (may be empty)."""
        if self._stream is None:
            return ""
        self._ids.append(token_id)
        piece = self._stream.step(self._tok, token_id) or ""
        self._given += len(piece)
        self._holding = not piece
        return piece

    def rest(self) -> str:
        """At the end: the text still held back (a character no later token completed, which
        the whole output's decoding shows as U+FFFD), so that the pieces and it make the
        decoding of every token. One decode of the output, only when the last step gave
        nothing (most requests end on a piece: nothing to decode)."""
        if self._stream is None or not self._holding:
            return ""
        return self._tok.decode(self._ids, skip_special_tokens=True)[self._given:]
