"""How one generation should run: `GenerateOptions`, the single list of Generate's options.

Both clients take it (`generate(prompt, options=...)`), and the keyword form
`generate(prompt, max_tokens=8, seed=3)` builds one from the keywords, so the
option names are written here and nowhere else: `wire.build_generate_request`
encodes it and `pdctl` fills it from its arguments by the same names.

Validation refuses what is wrong whatever the cluster (types, ranges, unknown
mode names) with an `InvalidArgumentError`, before anything is sent. Limits
that depend on the cluster (the vocabulary, the context length, this router's
max_tokens ceiling) stay the router's to check, with its own message.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pdserve_client import contract
from pdserve_client.types import InvalidArgumentError

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
# Extra gRPC time past the request's own deadline, so the router's DEADLINE_EXCEEDED
# error event (with its message) arrives before the transport deadline fires.
DEADLINE_GRACE_S = 1.0
MAX_DEADLINE_S = UINT32_MAX // 1000
"""Longest deadline the wire carries (GenerateRequest.deadline_ms is a uint32), about 49 days."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateOptions:
    """Options of one Generate call; only `max_tokens` is required.

        options = GenerateOptions(max_tokens=64, temperature=0.7, seed=1, tenant="acme")
        client.generate(prompt_ids=[1, 2, 3], options=options)
        client.generate(prompt_ids=[4, 5], options=options, seed=2)   # keywords override

    Raises InvalidArgumentError (a ValueError and a PdError INVALID_ARGUMENT)
    naming the field, the rule and the value given.
    """

    max_tokens: int
    """Most tokens to generate, >= 1 (the router refuses more than its limit or the model's context)."""
    temperature: float = 0.0
    """Sampling temperature, finite and >= 0; 0 is greedy (argmax)."""
    top_k: int = 0
    """Sample among the k most likely tokens; 0 disables top-k."""
    top_p: float = 1.0
    """Sample from the smallest set whose probability reaches top_p, in (0, 1]; 1 disables top-p."""
    seed: int | None = None
    """Sampler seed (uint64). None: the router picks one for a sampled request, so a retry
    repeats the tokens already sent."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end the generation besides end-of-sequence (any iterable; kept as a tuple)."""
    ignore_eos: bool = False
    """Keep generating past end-of-sequence, until max_tokens or a stop id (benchmarks)."""
    first_step: int = 0
    """Resume a stream: the prompt ends with the first `first_step` tokens a request with
    the same prompt, sampling and seed already gave; the tokens after them come, exactly
    as an uninterrupted run gives them (max_tokens counts only those). Less than the
    prompt's length."""
    logprobs: int | None = None
    """Log-probabilities with each token (TokenEvent.logprobs): None, none; 0, the chosen
    token's only; k in 1..20 (contract.MAX_LOGPROBS), also the k most likely tokens'. The
    model's own, before temperature, top-k and top-p."""
    mode: str | None = None
    """Serving mode, one of contract.MODES ('disaggregated', 'colocated', 'auto', 'shadow',
    'canary'), any case; None: the router's default."""
    tenant: str = ""
    """Tenant the request is admitted and accounted under ('': the one the client's
    certificate names; the router refuses another unless the caller is an operator)."""
    slo_ttft_ms: float | None = None
    """Time-to-first-token target for admission and routing, ms, >= 0; None or 0: no target."""
    slo_tpot_ms: float | None = None
    """Time-per-output-token target for admission and routing, ms, >= 0; None or 0: no target."""
    request_id: str | None = None
    """Request id (Cancel takes it); None: a fresh uuid per call. Leave it None in options
    shared by several requests."""
    deadline_s: float | None = None
    """Deadline, s from the call, > 0: the router ends the request DEADLINE_EXCEEDED once it
    passes. None: the router's default."""
    priority: int = 0
    """Place among the tenant's requests waiting in the router's admission queue, in
    [-1000, 1000] (contract.MAX_PRIORITY): higher first, equal ones in arrival order."""

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, 1, UINT32_MAX)
        _check_number("temperature", self.temperature, "a finite number >= 0", lambda v: v >= 0)
        _check_int("top_k", self.top_k, 0, UINT32_MAX)
        _check_number("top_p", self.top_p, "a number in (0, 1]", lambda v: 0 < v <= 1)
        if self.seed is not None:
            _check_int("seed", self.seed, 0, UINT64_MAX)
        stop_ids = _token_ids(self.stop_token_ids)
        if stop_ids is None:
            raise _invalid("stop_token_ids", f"a sequence of token ids, integers in [0, {UINT32_MAX}]",
                           self.stop_token_ids)
        object.__setattr__(self, "stop_token_ids", stop_ids)
        _check_int("first_step", self.first_step, 0, UINT32_MAX)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, contract.MAX_LOGPROBS)
        if not isinstance(self.ignore_eos, bool):
            raise _invalid("ignore_eos", "True or False", self.ignore_eos)
        if self.mode is not None:
            if not isinstance(self.mode, str) or self.mode.lower() not in contract.MODES:
                raise _invalid("mode", f"None or one of {', '.join(contract.MODES)}", self.mode)
            object.__setattr__(self, "mode", self.mode.lower())
        if not isinstance(self.tenant, str):
            raise _invalid("tenant", "a string", self.tenant)
        for name in ("slo_ttft_ms", "slo_tpot_ms"):
            if getattr(self, name) is not None:
                _check_number(name, getattr(self, name), "None or a finite number >= 0", lambda v: v >= 0)
        if self.request_id is not None and (not isinstance(self.request_id, str) or not self.request_id):
            raise _invalid("request_id", "None or a non-empty string", self.request_id)
        _check_int("priority", self.priority, -contract.MAX_PRIORITY, contract.MAX_PRIORITY)
        if self.deadline_s is not None:
            _check_number("deadline_s", self.deadline_s, f"None or a number in (0, {MAX_DEADLINE_S}]",
                          lambda v: 0 < v <= MAX_DEADLINE_S)

    @property
    def grpc_timeout_s(self) -> float | None:
        """gRPC timeout of the Generate call: none without a deadline (a long generation is not a hung one)."""
        return None if self.deadline_s is None else self.deadline_s + DEADLINE_GRACE_S


OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(GenerateOptions))
"""Every option's name: the keywords `generate` accepts besides the prompt."""


def resolve_options(options: GenerateOptions | None, keywords: Mapping[str, Any]) -> GenerateOptions:
    """`options` with `keywords` laid over it; without `options`, the keywords alone
    (then `max_tokens` is required). An unknown keyword is a TypeError, as for any call."""
    unknown = sorted(keywords.keys() - OPTION_NAMES)
    if unknown:
        raise TypeError(f"generate() got unexpected keyword argument(s) {', '.join(unknown)}; "
                        f"options are {', '.join(sorted(OPTION_NAMES))}")
    if options is None:
        if "max_tokens" not in keywords:
            raise TypeError("generate() needs max_tokens= (or options=GenerateOptions(max_tokens=...))")
        return GenerateOptions(**keywords)
    if not isinstance(options, GenerateOptions):
        raise TypeError(f"options must be a GenerateOptions, got {type(options).__name__}")
    return dataclasses.replace(options, **keywords) if keywords else options


def _invalid(name: str, rule: str, value: Any) -> InvalidArgumentError:
    return InvalidArgumentError(f"{name} must be {rule}, got {value!r}")


def _token_ids(value: Any) -> tuple[int, ...] | None:
    """`value` as a tuple of uint32 token ids, or None if it is not an iterable of them."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        return None
    ids = tuple(value)
    return ids if all(_is_int_in(t, 0, UINT32_MAX) for t in ids) else None


def _is_int_in(value: Any, low: int, high: int) -> bool:
    # bool is an int subclass; True as a token count is a mistake, not a 1.
    return not isinstance(value, bool) and isinstance(value, int) and low <= value <= high


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if not _is_int_in(value, low, high):
        raise _invalid(name, f"an integer in [{low}, {high}]", value)


def _check_number(name: str, value: Any, rule: str, ok) -> None:
    # numbers.Real: numpy's floats too; bool is a Real, and never meant as one here.
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not ok(value):
        raise _invalid(name, rule, value)
