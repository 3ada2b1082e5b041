"""Admission: every check a request must pass before the router does any work.

Two stages. `admit` needs only the request and the router's config (mode,
prompt, max_tokens, sampling); `check_cluster` needs the workers' declared
capacity (vocab size, context length, K/V blocks). Every rejection names the
problem and its numbers.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from pdserve_client import contract
from router.config import RouterConfig
from router.requests.placement import Demand, capacity_shortfall
from router.requests.text import encode
from router.types import GenerateParams, Mode, Route, RouterError, Sampling, Slo, StatusCode
from runtime.directory.records import ClusterSnapshot


@dataclasses.dataclass(frozen=True, slots=True)
class Admitted:
    """A request that passed the static checks, normalized."""

    request_id: str
    tenant: str
    prompt: tuple[int, ...]
    max_tokens: int
    sampling: Sampling
    route: Route
    """Route of retries (the first attempt follows the mode's plan)."""
    deadline_s: float | None
    """Time budget from receipt; None means no deadline beyond the client's."""
    mode: str = "disaggregated"
    """Router mode (router/requests/planner.py): the request's own, or the router default."""
    slo: Slo = Slo()
    """Targets as the request named them (tenant defaults are applied by the planner)."""
    priority: int = 0
    """Its place among its tenant's requests in the admission queue (higher first)."""

    def replaying(self, given: Sequence[int]) -> Admitted:
        """The request as an attempt runs it after the client got `given` (its first outputs,
        all but the last of what it has: output.py `resume_point`): the prompt followed by
        them, replayed as decode computed them, sampling from step len(given) on
        (SamplingParams.first_step), a budget that much smaller. Exact kernels make the
        rest the bits an uninterrupted run gives (docs/design.md, Failures). None given:
        the request itself."""
        if not given:
            return self
        return dataclasses.replace(self, prompt=self.prompt + tuple(given), max_tokens=self.max_tokens - len(given),
                                   sampling=dataclasses.replace(
                                       self.sampling, first_step=self.sampling.first_step + len(given)))

    @property
    def demand(self) -> Demand:
        """The request's shape for placement."""
        return Demand(len(self.prompt), self.max_tokens, max(self.prompt))


def _invalid(message: str) -> RouterError:
    return RouterError(StatusCode.INVALID_ARGUMENT, message)


_MODE_NAMES = {Mode[name.upper()]: name for name in contract.MODES}


def admit(params: GenerateParams, config: RouterConfig, default_mode: str | Route, tokenizer: Any | None = None,
          seed_source: Callable[[], int] = lambda: secrets.randbits(63)) -> Admitted:
    """Static checks and normalization; raises RouterError (INVALID_ARGUMENT).
    `default_mode`: the router's mode name for requests with mode UNSPECIFIED (a
    Route means the forced mode of that route)."""
    if isinstance(default_mode, Route):
        default_mode = default_mode.name.lower()
    mode = _MODE_NAMES.get(params.mode, default_mode)
    route = Route.COLOCATED if mode in ("colocated", "shadow") else Route.DISAGGREGATED
    for name, value in (("slo.ttft_ms", params.slo.ttft_ms), ("slo.tpot_ms", params.slo.tpot_ms)):
        if not (math.isfinite(value) and value >= 0):
            raise _invalid(f"{name} must be a finite number >= 0 (0 = no target), got {value}")
    for name, value, limit in (("request_id", params.request_id, contract.MAX_REQUEST_ID_BYTES),
                               ("tenant", params.tenant, contract.MAX_TENANT_BYTES)):
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise _invalid(f"{name} is {size} bytes in UTF-8; at most {limit}")
    if not -contract.MAX_PRIORITY <= params.priority <= contract.MAX_PRIORITY:
        limit = contract.MAX_PRIORITY
        raise _invalid(f"priority must be in [-{limit}, {limit}], got {params.priority}")
    prompt = _prompt_ids(params, tokenizer)
    if params.max_tokens <= 0:
        raise _invalid("max_tokens must be > 0, got 0")
    if params.max_tokens > config.max_tokens_limit:
        raise _invalid(f"max_tokens {params.max_tokens} exceeds this router's limit of {config.max_tokens_limit}")
    sampling = _check_sampling(params.sampling, seed_source)
    if sampling.first_step >= len(prompt):
        raise _invalid(f"sampling.first_step {sampling.first_step} replays the whole prompt of {len(prompt)} tokens "
                       f"(at most {len(prompt) - 1}: the prompt proper comes first)")
    deadline_ms = params.deadline_ms or config.default_deadline_ms
    return Admitted(
        request_id=params.request_id or uuid.uuid4().hex,
        tenant=params.tenant or config.default_tenant,
        prompt=prompt,
        max_tokens=params.max_tokens,
        sampling=sampling,
        route=route,
        deadline_s=deadline_ms / 1000.0 if deadline_ms else None,
        mode=mode,
        slo=params.slo,
        priority=params.priority,
    )


def _prompt_ids(params: GenerateParams, tokenizer: Any | None) -> tuple[int, ...]:
    if params.prompt_token_ids is not None:
        prompt = tuple(params.prompt_token_ids)
    elif params.prompt_text is not None:
        if tokenizer is None:
            raise _invalid("prompt_text needs a tokenizer, and this router has none (start it with --model "
                           "pointing at a checkpoint directory with tokenizer.json); send prompt_token_ids instead")
        prompt = tuple(encode(tokenizer, params.prompt_text)) if params.prompt_text else ()
    else:
        raise _invalid("no prompt: set prompt_text or prompt_token_ids")
    if not prompt:
        raise _invalid("prompt is empty (0 tokens)")
    return prompt


def _check_sampling(s: Sampling, seed_source: Callable[[], int]) -> Sampling:
    if not math.isfinite(s.temperature) or s.temperature < 0:
        raise _invalid(f"sampling.temperature must be a finite number >= 0, got {s.temperature}")
    if not math.isfinite(s.top_p):
        raise _invalid(f"sampling.top_p must be finite, got {s.top_p}")
    if s.logprobs is not None and not 0 <= s.logprobs <= contract.MAX_LOGPROBS:
        raise _invalid(f"sampling.logprobs must be in 0..{contract.MAX_LOGPROBS} (how many most likely tokens "
                       f"to list beside each token's own), got {s.logprobs}")
    if s.seed is None and s.temperature > 0:
        # A retry after partial output must reproduce the tokens already sent,
        # so every attempt of a sampled request uses one router-chosen seed.
        return dataclasses.replace(s, seed=seed_source())
    return s


def max_model_len(cluster: ClusterSnapshot) -> int | None:
    """The most tokens any decode-capable worker of `cluster` holds for one request, prompt
    and generated together (its max_model_len); None when there is none, or one that
    declares no limit."""
    lengths = [w.capacity.max_model_len for w in cluster.workers if w.can_decode]
    return max(lengths) if lengths and all(lengths) else None


async def known_max_model_len(view) -> int | None:
    """`max_model_len` of `view`'s (a ClusterView's) last snapshot, whatever its age (workers'
    limits change rarely), or of a fresh one before the first; raises RouterError when the
    directory gives none. The fronts refuse an over-long prompt with it before admission."""
    cluster = view.last
    return max_model_len(cluster if cluster is not None else await view.get())


def check_cluster(req: Admitted, cluster: ClusterSnapshot) -> None:
    """Checks against the workers' declared capacity; raises RouterError
    (UNAVAILABLE, INVALID_ARGUMENT, RESOURCE_EXHAUSTED).

    With workers of different shapes the most permissive declared limit
    applies here; placement then skips workers that cannot take the request.
    """
    decoders = [w for w in cluster.workers if w.can_decode]
    if not decoders:
        what = "no workers are registered" if not cluster.workers else "no decode-capable worker is registered"
        raise RouterError(StatusCode.UNAVAILABLE, f"{what} in the directory")
    vocab = [w.capacity.vocab_size for w in decoders]
    if all(vocab):
        vocab_size = max(vocab)
        bad = next(((i, t) for i, t in enumerate(req.prompt) if t >= vocab_size), None)
        if bad is not None:
            raise _invalid(f"prompt token id {bad[1]} at position {bad[0]} is out of range: vocab_size is {vocab_size}")
    max_len = max_model_len(cluster)
    if max_len is not None:
        total = len(req.prompt) + req.max_tokens
        if total > max_len:
            raise _invalid(f"prompt ({len(req.prompt)} tokens) + max_tokens ({req.max_tokens}) = {total} "
                           f"exceeds max_model_len {max_len}")
    shortfall = capacity_shortfall(decoders, req.demand)
    if shortfall:
        raise RouterError(StatusCode.RESOURCE_EXHAUSTED, shortfall)
