"""The seeded presets' tokenizer: byte-level BPE from a vocabulary and merges built in code.

A preset has no checkpoint directory, so no tokenizer.json; this gives it one, so a cluster
on the embedded default serves text as a real checkpoint does (router/requests/text.py),
and `pdserve export-checkpoint` writes it beside the weights (runtime/engine/checkpoint.py).

It is constructed, not trained: the `tokenizers` trainer's output may change with its
version, while this one is a pure function of the config, so every machine and every
`tokenizers` version builds the same `to_str()`, which the release manifest's tokenizer
digest hashes (router/release/manifest.py; docs/design.md, The release).

Ids, for a vocabulary of V (every id in [0, V) is a token, so any id a model samples decodes):

    0 <unk>, 1 <s> (bos), 2 </s> (eos)           ModelConfig's bos_token_id and eos_token_id
    3..6 <|system|> <|user|> <|assistant|> <|end|>  the chat template's (CHAT_TEMPLATE)
    7..262                                       byte b is id 7 + b (GPT-2's byte-level alphabet)
    263..V-1                                     merged pieces, most useful first

The merged pieces are the letter n-grams of a list of common English words (each also with
a leading space and capitalized, as text has them), ranked by how often they occur in the
list weighted by each word's rank; past those, letter n-grams ranked by a letter-bigram
model of the same list. The set is closed under substrings (a piece never outranks a part
of itself), and each piece gets a merge for every way it splits in two, so BPE's pairing
never strands a piece halfway: encoding stops only where no two neighbours form a piece.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from .config import ModelConfig

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
SPECIAL_TOKENS = (UNK, BOS, EOS, *CHAT_TOKENS)
"""Ids 0..6, in this order; bos and eos where ModelConfig's defaults put them."""
FIRST_BYTE_ID = len(SPECIAL_TOKENS)
FIRST_MERGED_ID = FIRST_BYTE_ID + 256

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('role ' ~ message['role'] ~ ' is not one of system, user, assistant') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
"""The presets' chat template (Jinja, as transformers renders it): a turn is its role's token,
a newline, the content and <|end|>. The role is checked before it names a token, so a message
cannot spell <|end|> through its role."""

WORD_WEIGHT_SCALE = 10**6
"""A word of rank r weighs WORD_WEIGHT_SCALE // (r + 10) (times its form's weight): Zipf's
law, flattened at the top. Integers, so the counts and their order are exact everywhere."""
FORM_WEIGHTS = ((" ", False, 8), ("", False, 1), (" ", True, 2), ("", True, 1))
"""How a word occurs in text, as the byte-level pre-tokenizer cuts it (lead, capitalized,
weight): after a space, bare (after a newline or a bracket), capitalized after a space,
capitalized bare."""
EXTRA_RANK = 50
"""The pieces that are not words (EXTRAS) weigh as words ranked from here on."""


def preset_tokenizer(cfg: ModelConfig) -> Tokenizer:
    """The byte-level BPE tokenizer of a preset's config: `encode(text)` puts <s> first,
    `decode` skips the special tokens when asked. Built once per vocabulary size and shared:
    do not change its settings (truncation, padding) in place."""
    ids = (0, cfg.bos_token_id, cfg.eos_ids)
    if ids != (0, 1, (2,)):
        raise ValueError(f"the preset tokenizer puts {UNK}, {BOS}, {EOS} at ids 0, 1, 2; this config has "
                         f"bos_token_id {cfg.bos_token_id}, eos_token_id {cfg.eos_token_id}")
    if cfg.vocab_size < FIRST_MERGED_ID:
        raise ValueError(f"vocab_size {cfg.vocab_size} is below the {FIRST_MERGED_ID} ids of the special "
                         f"tokens and the bytes")
    return _build(cfg.vocab_size)


def tokenizer_config(cfg: ModelConfig) -> dict:
    """tokenizer_config.json for a preset's exported checkpoint: what transformers'
    AutoTokenizer needs beside tokenizer.json and chat_template.jinja."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "unk_token": UNK,
            "model_max_length": cfg.max_position_embeddings, "clean_up_tokenization_spaces": False}


def save_preset_tokenizer(cfg: ModelConfig, out: str | Path) -> None:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into `out`."""
    root = Path(out)
    (root / "tokenizer.json").write_text(preset_tokenizer(cfg).to_str(), encoding="utf-8")
    (root / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(cfg), indent=2, sort_keys=True))
    (root / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")


@functools.lru_cache(maxsize=4)
def _build(vocab_size: int) -> Tokenizer:
    chars = byte_chars()
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({c: FIRST_BYTE_ID + b for b, c in enumerate(chars)})
    pieces = merged_pieces(vocab_size - FIRST_MERGED_ID)
    vocab.update({p: FIRST_MERGED_ID + i for i, p in enumerate(pieces)})
    assert len(vocab) == vocab_size, (len(vocab), vocab_size)
    merges = [(p[:k], p[k:]) for p in pieces for k in range(1, len(p))]
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS}:1 $B:1", special_tokens=[(BOS, 1)])
    return tok


def byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: the printable character that stands for byte b, at b
    (what tokenizers' ByteLevel pre-tokenizer and decoder map bytes to and from)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def merged_pieces(count: int) -> list[str]:
    """The first `count` merged pieces (byte-level strings of two or more bytes), most useful first."""
    counts = _ngram_counts()
    ranked = sorted(counts, key=lambda p: (-counts[p], len(p), p))[:count]
    if len(ranked) < count:
        ranked += _markov_pieces(set(ranked), counts, count - len(ranked))
    if len(ranked) < count:
        raise ValueError(f"the preset tokenizer builds at most {FIRST_MERGED_ID + len(ranked)} tokens")
    return ranked


def _forms() -> list[tuple[str, int]]:
    """The byte-level strings the word list and EXTRAS stand for, with their weights."""
    chars = byte_chars()
    forms = []
    for rank, word in enumerate(dict.fromkeys(WORDS.split())):
        for lead, capital, times in FORM_WEIGHTS:
            forms.append((lead + (word.capitalize() if capital else word), times * WORD_WEIGHT_SCALE // (rank + 10)))
    forms += [(extra, WORD_WEIGHT_SCALE // (EXTRA_RANK + i + 10)) for i, extra in enumerate(EXTRAS)]
    return [("".join(chars[b] for b in text.encode()), weight) for text, weight in forms]


@functools.lru_cache(maxsize=1)
def _ngram_counts() -> dict[str, int]:
    """Weighted occurrences of every substring of two or more bytes of the forms."""
    counts: dict[str, int] = {}
    for form, weight in _forms():
        for i in range(len(form)):
            for j in range(i + 2, len(form) + 1):
                counts[form[i:j]] = counts.get(form[i:j], 0) + weight
    return counts


def _markov_pieces(have: set[str], counts: dict[str, int], count: int) -> list[str]:
    """`count` more pieces: runs of lowercase letters, bare or after a space, two to four
    characters long (the space counted), ranked by a letter-bigram model of the word list's
    counts; a run is admitted only when both of its one-shorter parts are pieces already
    (the set stays closed under substrings).

    Float products and quotients only (no log, no sum of floats): IEEE rounds each the same
    on every machine, so the order is the same everywhere; ties keep the enumeration order."""
    starts = [byte_chars()[ord(" ")], *LETTERS]
    seen = np.array([[counts.get(a + b, 0) + 1 for b in LETTERS] for a in starts], dtype=np.int64)  # [27, 26]
    # Integer sums (exact in any order), then one rounding each.
    two = seen.astype(np.float64) / float(seen.sum())  # [27, 26]: P(first two)
    step = seen[1:].astype(np.float64) / seen[1:].sum(axis=1, keepdims=True).astype(np.float64)  # [26, 26]
    three = two[:, :, None] * step[None, :, :]  # [27, 26, 26]
    four = three[:, :, :, None] * step[None, None, :, :]  # [27, 26, 26, 26]
    grids = (two, three, four)
    scores = np.concatenate([g.ravel() for g in grids])
    offsets = np.cumsum([0] + [g.size for g in grids])
    out: list[str] = []
    for flat in np.argsort(-scores, kind="stable"):
        n = int(np.searchsorted(offsets, flat, side="right")) - 1
        first_index, *rest = np.unravel_index(int(flat - offsets[n]), grids[n].shape)
        piece = starts[first_index] + "".join(LETTERS[i] for i in rest)
        if piece not in have and (len(piece) == 2 or (piece[:-1] in have and piece[1:] in have)):
            out.append(piece)
            have.add(piece)
            if len(out) == count:
                break
    return out


LETTERS = "abcdefghijklmnopqrstuvwxyz"
EXTRAS = (
    "\n\n", "  ", "    ", "        ", "   ", "       ", "\n\n\n", " (", "),", ").", " \"", "\",", ".\"",
    "'s", "'t", "'re", "'ve", "'ll", "'m", "'d", "...", " -", " --", "://", " /", " =", " ==", " +", " *",
    "**", " #", "##", "###", " [", "],", " {", " }", "();", "()", " <", " >", " |", " $", " %", " &", " 1",
    " 2", " 3", " 4", " 5", " 6", " 7", " 8", " 9", " 0", "00", "000", "19", "20", "10", "201", "202",
)
"""Pieces that are not words: whitespace runs, punctuation after a space, contractions
(the pre-tokenizer cuts "'s" off), digits."""

WORDS = """
the of and to a in is it you that he was for on are with as i his they be at one have this from or had
by not word but what some we can out other were all there when up use your how said an each she which do
their time if will way about many then them write would like so these her long make thing see him two
has look more day could go come did number sound no most people my over know water than call first who
may down side been now find any new work part take get place made live where after back little only round
man year came show every good me give our under name very through just form sentence great think say help
low line differ turn cause much mean before move right boy old too same tell does set three want air well
also play small end put home read hand port large spell add even land here must big high such follow act
why ask men change went light kind off need house picture try us again animal point mother world near build
self earth father head stand own page should country found answer school grow study still learn plant cover
food sun four between state keep eye never last let thought city tree cross farm hard start might story saw
far sea draw left late run while press close night real life few north open seem together next white
children begin got walk example ease paper group always music those both mark often letter until mile river
car feet care second book carry took science eat room friend began idea fish mountain stop once base hear
horse cut sure watch color face wood main enough plain girl usual young ready above ever red list though
feel talk bird soon body dog family direct pose leave song measure door product black short numeral class
wind question happen complete ship area half rock order fire south problem piece told knew pass since top
whole king space heard best hour better true during hundred five remember step early hold west ground
interest reach fast verb sing listen six table travel less morning ten simple several vowel toward war lay
against pattern slow center love person money serve appear road map rain rule govern pull cold notice voice
unit power town fine certain fly fall lead cry dark machine note wait plan figure star box noun field rest
correct able pound done beauty drive stood contain front teach week final gave green oh quick develop ocean
warm free minute strong special mind behind clear tail produce fact street inch multiply nothing course stay
wheel full force blue object decide surface deep moon island foot system busy test record boat common gold
possible plane dry wonder laugh thousand ago ran check game shape hot miss brought heat snow tire bring yes
distant fill east paint language among
information because however government company including following provide service support development
process result business program general public level within without around another important different
something everything really actually please thank thanks hello explain code function value return error
file server request response user assistant text token model data learning research history national
international community university american united states century social political economic human health
market local members women being years things called making working looked used using based given known
public million percent according report today understand already include includes although itself
themselves himself herself whether either rather quite probably perhaps similar various specific available
current recent common major possible likely early later usually simply especially particularly generally
following example examples question questions answers number numbers first second third last
next previous final total single double per each every both several many few most least more less
experience education president policy security control management performance quality design structure
network memory cache request requests worker workers router serving prefill decode transfer block blocks
"""
"""Common English words, roughly most frequent first (the first block is the start of Fry's
list of common words, the rest words of prompts and of this project). Only their order
and spelling matter: it is where the merged pieces and their ranks come from."""
