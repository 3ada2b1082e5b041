"""The presets' tokenizer (runtime/engine/preset_tokenizer.py): every id a token, the same
bytes in every process, exact round trips, English in fewer tokens than bytes, and the
streaming detokenizer's contract over whatever ids a random model samples."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from router.requests.text import Detokenizer, load_tokenizer
from runtime.engine.checkpoint import export_preset
from runtime.engine.config import ModelConfig
from runtime.engine.preset_tokenizer import (
    CHAT_TOKENS,
    FIRST_BYTE_ID,
    FIRST_MERGED_ID,
    _build,
    byte_chars,
    preset_tokenizer,
)
from runtime.engine.presets import PRESETS
from tests.support import REPO

ENGLISH = (  # prose the word list was not written from
    "The quick brown fox jumps over the lazy dog. When the router receives a request, it decides whether the "
    "prompt should be computed on one worker or split between two: a prefill worker computes the cache of the "
    "whole prompt, and a decode worker then generates the answer one token at a time. Most people never notice "
    "the difference, because the first word of the answer arrives at about the same time either way. She said "
    "that her family had lived in the same small town for more than a hundred years, and that every child there "
    "learned to swim in the river before they could read."
)
MAX_TOKENS_PER_BYTE = {"tiny": 0.6, "small": 0.3}
"""Measured 0.49 and 0.24 on ENGLISH (a byte-level tokenizer without merges: 1.0)."""


@pytest.fixture(scope="module", params=sorted(PRESETS))
def preset(request):
    return request.param, preset_tokenizer(PRESETS[request.param])


def test_every_id_is_a_token_laid_out_as_documented(preset):
    name, tok = preset
    vocab_size = PRESETS[name].vocab_size
    assert tok.get_vocab_size() == vocab_size and len(tok.get_vocab()) == vocab_size
    assert [tok.id_to_token(i) for i in range(FIRST_BYTE_ID)] == ["<unk>", "<s>", "</s>", *CHAT_TOKENS]
    assert [tok.id_to_token(FIRST_BYTE_ID + b) for b in range(256)] == byte_chars()
    assert all(tok.id_to_token(i) is not None for i in range(vocab_size))
    assert tok.id_to_token(vocab_size) is None
    # Every merged piece decodes to text of two or more bytes, and back to itself.
    for i in range(FIRST_MERGED_ID, vocab_size, 97):
        text = tok.decode([i])
        assert len(text.encode()) >= 2 and tok.encode(text, add_special_tokens=False).ids == [i]
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    assert specials == {"<unk>", "<s>", "</s>", *CHAT_TOKENS}


def test_the_same_bytes_in_a_rebuild_and_in_another_process():
    built = {name: _build.__wrapped__(cfg.vocab_size).to_str() for name, cfg in PRESETS.items()}
    assert built == {name: preset_tokenizer(cfg).to_str() for name, cfg in PRESETS.items()}
    code = ("import hashlib, json; from runtime.engine.presets import PRESETS; "
            "from runtime.engine.preset_tokenizer import preset_tokenizer; print(json.dumps({n: hashlib.sha256("
            "preset_tokenizer(c).to_str().encode()).hexdigest() for n, c in PRESETS.items()}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert json.loads(out) == {name: hashlib.sha256(s.encode()).hexdigest() for name, s in built.items()}
    assert preset_tokenizer(PRESETS["tiny"]) is preset_tokenizer(PRESETS["tiny"])  # built once


def test_bos_first_and_english_in_clearly_fewer_tokens_than_bytes(preset):
    name, tok = preset
    enc = tok.encode(ENGLISH)
    assert enc.ids[0] == PRESETS[name].bos_token_id and tok.decode(enc.ids) == ENGLISH
    ratio = (len(enc.ids) - 1) / len(ENGLISH.encode())
    assert ratio < MAX_TOKENS_PER_BYTE[name], ratio


@settings(max_examples=200, deadline=None)
@given(text=st.text() | st.lists(st.sampled_from(["<s>", "</s>", "<|user|>", "<|end|>", " the", "é", "\n"])
                                  | st.text(max_size=5)).map("".join))
def test_any_text_round_trips_exactly(preset, text):
    _, tok = preset
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    with_bos = tok.encode(text).ids
    assert with_bos[0] == 1 and with_bos[1:] == ids


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_streamed_pieces_are_the_decoding_less_a_held_back_cut_character(preset, data):
    """What a random model samples, cut UTF-8 and bytes that are never UTF-8 included.

    The contract of tokenizers' DecodeStream (and the router's Detokenizer over it): no
    step raises; the pieces concatenate to a prefix of decode(ids, skip_special_tokens=True);
    they are all of it unless that decoding ends in U+FFFD, whose run stays held back
    (a cut or invalid byte sequence, which a later token might have completed)."""
    name, tok = preset
    token = st.integers(0, PRESETS[name].vocab_size - 1) | st.integers(FIRST_BYTE_ID + 0x80, FIRST_BYTE_ID + 255)
    ids = data.draw(st.lists(token, max_size=40))
    stream = DecodeStream(skip_special_tokens=True)
    streamed = "".join(stream.step(tok, i) or "" for i in ids)
    whole = tok.decode(ids, skip_special_tokens=True)
    assert whole.startswith(streamed)
    assert streamed == whole or whole.endswith("\ufffd"), (streamed, whole)
    detok = Detokenizer(tok)
    assert "".join(detok.add(i) for i in ids) == streamed
    assert streamed + detok.rest() == whole  # the router's Complete.text_tail makes it whole


def test_a_cut_character_waits_for_its_last_byte():
    tok = preset_tokenizer(PRESETS["tiny"])
    euro = [FIRST_BYTE_ID + b for b in "€".encode()]
    stream = DecodeStream(skip_special_tokens=True)
    assert [stream.step(tok, i) for i in [tok.token_to_id("Ġt"), *euro, 2]] == [" t", None, None, "€", None]
    lone = DecodeStream(skip_special_tokens=True)
    assert [lone.step(tok, i) for i in (FIRST_BYTE_ID + 0xFF, FIRST_BYTE_ID + ord("a"))] == [None, "\ufffda"]


def test_configs_it_cannot_serve_are_refused():
    tiny = PRESETS["tiny"]
    with pytest.raises(ValueError, match="bos_token_id 5"):
        preset_tokenizer(ModelConfig(**{**tiny.__dict__, "bos_token_id": 5}))
    with pytest.raises(ValueError, match="vocab_size 100 is below the 263"):
        preset_tokenizer(ModelConfig(**{**tiny.__dict__, "vocab_size": 100}))


def test_the_router_loads_it_for_a_preset_name_and_an_export_carries_it(tmp_path):
    assert load_tokenizer("tiny") is preset_tokenizer(PRESETS["tiny"])
    assert load_tokenizer("small@7") is preset_tokenizer(PRESETS["small"])
    out = export_preset("tiny", tmp_path / "tiny")
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= {p.name for p in out.iterdir()}
    assert Tokenizer.from_file(str(out / "tokenizer.json")).to_str() == preset_tokenizer(PRESETS["tiny"]).to_str()
    assert load_tokenizer(str(out)).encode(ENGLISH).ids == preset_tokenizer(PRESETS["tiny"]).encode(ENGLISH).ids
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert (config["bos_token"], config["eos_token"], config["model_max_length"]) == ("<s>", "</s>", 2048)
