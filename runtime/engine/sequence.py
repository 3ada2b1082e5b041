"""One request's state inside an engine.

    WAITING --prefill chunks--> PREFILLING --last chunk--> DECODING --stop--> FINISHED
    WAITING --import_kv + commit_import--> DECODING            (disaggregated decode)

The engine owns transitions; `Sequence` is plain data.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from .errors import InvalidRequest
from .sampler import SamplingParams, TokenLogprobs


class SeqState(enum.IntEnum):
    """Ordered: `state >= FINISHED` means finished."""

    WAITING = 0
    PREFILLING = 1
    DECODING = 2
    FINISHED = 3


class FinishReason(enum.Enum):
    """Why generation stopped."""

    STOP = "stop"          # an EOS or stop token was generated
    LENGTH = "length"      # max_tokens reached
    CONTEXT = "context"    # the model's context length reached
    ABORTED = "aborted"    # cancelled or failed


@dataclass(slots=True)
class Sequence:
    """Prompt, outputs and cache placement of one request."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    salt: bytes = b""
    block_table: list[int] = field(default_factory=list)
    block_keys: list[bytes] = field(default_factory=list)
    num_cached_tokens: int = 0
    """Prompt tokens whose K/V came from the prefix cache (not computed)."""
    num_computed_tokens: int = 0
    """Tokens whose K/V is in the cache (cached + computed)."""
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    """Beside output_ids when the request asked (SamplingParams.logprobs), else empty;
    None for a token this engine did not sample (a hand-off's token 0)."""
    state: SeqState = SeqState.WAITING
    finish_reason: FinishReason | None = None
    created_s: float = field(default_factory=time.monotonic)
    """When the sequence was made (monotonic): its blocks' age (`pdctl blocks`)."""

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt length."""
        return len(self.prompt_ids)

    @property
    def replay_start(self) -> int:
        """Position of the first replayed output in the prompt (SamplingParams.first_step;
        the prompt's length when none is)."""
        return len(self.prompt_ids) - self.sampling.first_step

    @property
    def next_step(self) -> int:
        """The output index of the next token sampled (the sampler's step)."""
        return self.sampling.first_step + len(self.output_ids)

    @property
    def token_ids(self) -> list[int]:
        """Prompt followed by outputs."""
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        """Prompt plus output length."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        """True once generation has stopped."""
        return self.state >= SeqState.FINISHED

    def logprobs_of(self, index: int) -> TokenLogprobs | None:
        """Output `index`'s log-probabilities (None: not asked, or not sampled here)."""
        return self.output_logprobs[index] if index < len(self.output_logprobs) else None


def append_token(seq: Sequence, token: int, eos_ids, max_model_len: int,
                 logprobs: TokenLogprobs | None = None) -> None:
    """`token` is the sequence's next output: it decodes, or it is finished by a stop or EOS
    token (unless ignore_eos), by max_tokens, or by the context length (every engine's rule).
    `logprobs`: its log-probabilities, kept when the request asked."""
    seq.output_ids.append(token)
    if seq.sampling.logprobs is not None:
        seq.output_logprobs.append(logprobs)
    seq.state = SeqState.DECODING
    reason = None
    if token in seq.sampling.stop_token_ids or (not seq.sampling.ignore_eos and token in eos_ids):
        reason = FinishReason.STOP
    elif len(seq.output_ids) >= seq.max_tokens:
        reason = FinishReason.LENGTH
    elif seq.num_tokens >= max_model_len:
        reason = FinishReason.CONTEXT
    if reason is not None:
        seq.state, seq.finish_reason = SeqState.FINISHED, reason


def check_request(prompt_ids: list[int], max_tokens: int, sampling: SamplingParams | None, vocab_size: int,
                  max_model_len: int) -> None:
    """Raise InvalidRequest saying what is wrong with this prompt / budget (every engine's
    checks; an engine adds the refusals of its own)."""
    n = len(prompt_ids)
    if n == 0:
        raise InvalidRequest("prompt is empty")
    if max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be >= 1, got {max_tokens}")
    if n >= max_model_len:
        raise InvalidRequest(f"prompt of {n} tokens does not fit the context length "
                             f"{max_model_len} (at most {max_model_len - 1})")
    if sampling is not None and sampling.first_step >= n:
        raise InvalidRequest(f"first_step {sampling.first_step} replays the whole prompt of {n} tokens "
                             f"(at most {n - 1}: the prompt proper comes first)")
    if n + max_tokens > max_model_len:
        raise InvalidRequest(f"prompt {n} + max_tokens {max_tokens} exceeds the context "
                             f"length {max_model_len}")
    for i, t in enumerate(prompt_ids):
        if isinstance(t, bool) or not isinstance(t, int):
            raise InvalidRequest(f"token id {t!r} at position {i} is not an integer")
        if not 0 <= t < vocab_size:
            raise InvalidRequest(f"token id {t} at position {i} is outside the vocabulary "
                                 f"[0, {vocab_size})")


def block_range(seq: Sequence, block_size: int, first: int, count: int | None) -> int:
    """`count` checked (None: the prompt's blocks from `first`); InvalidRequest if
    [first, first + count) is outside the sequence's blocks."""
    count = -(-seq.num_prompt_tokens // block_size) - first if count is None else count
    if first < 0 or count < 0 or first + count > len(seq.block_table):
        raise InvalidRequest(f"block range [{first}, {first + count}) outside the sequence's "
                             f"{len(seq.block_table)} blocks")
    return count
