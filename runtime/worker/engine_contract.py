"""What pdserve's hand-off needs of an engine: the contract a worker's engine keeps.

The workers (prefill_worker/, decode_worker/, runtime/worker/loop.py) reach their engine
only through these calls, made on the engine loop's one thread. The built-in engine
(runtime/engine/engine.py) keeps the contract and is its reference
(tests/unit/engine/test_contract.py drives a whole hand-off through it alone); a second
engine behind the workers keeps the same contract, or says which part it cannot keep.

Who calls what, step by step (docs/design.md, A request; P the prefill worker, D the
decode worker, W a worker running a request colocated):

    step        caller              calls                                   gives back
    reserve     D (Decode.Reserve)  add_request(prompt, max_tokens)         free(seq) on every end
    compute     P, W                add_request(prompt, 1 / max_tokens),     free(seq) on every end
                                    prefill_chunk(seq, on_layer) until a
                                    token (on_layer: a layer's K/V for those
                                    tokens is final in the cache)
    send        P                   kv_views(seq, layer, blocks): read only
                                    after on_layer said the layer is final
    receive     D                   kv_views(...): written by the transport
    validate    P, D                kv_digest(seq): each end's, compared
    admit       D                   commit_import(seq, token 0): the K/V is
                                    the prompt's from here on
    decode      D, W                decode_step(seqs)
    end         P, D, W             free(seq): every block back             (idempotent)

Failure semantics, for every engine:
- `add_request` raises InvalidRequest (the client's to fix: its message says what) or
  OutOfBlocks (no room now: the router queues or places elsewhere), and then holds nothing.
- Any call on a sequence may raise; the worker then calls `free(seq)`, which must return
  every block the sequence held, whatever state it was in, and may be called twice.
- `kv_views` must be views of the cache memory itself, valid until `free`, in the layout
  the cache ABI names (`abi`): two engines may exchange K/V only when their ABI digests are
  compatible (`abi.check_compatible`), and equal bytes must mean equal K/V.
- Exactness: a sequence's tokens and K/V must not depend on its batch, on how its prompt
  was chunked, or on how much came from the prefix cache; a resumed request's replayed
  outputs (SamplingParams.first_step) give decode's K/V. An engine that cannot promise it
  says so (the router then checks the two ends' digests and regenerates instead of
  resuming: PD_ROUTER_RESUME_MID_STREAM=0).

Log-probabilities (SamplingParams.logprobs set): each token `prefill_chunk` or
`decode_step` samples has its `TokenLogprobs` (runtime/engine/sampler.py) beside it in
`seq.output_logprobs` (`append_token(..., logprobs)`; the workers read
`seq.logprobs_of(index)`): the model's raw log-softmax at that position, before
temperature, top-k and top-p, with the k most likely tokens, ties by lower id. They are
exact wherever the tokens are (the same bits in any batch, chunking or hand-off). A token
the engine did not sample, token 0 given to `commit_import`, has None: the prefill's
FirstToken carries its values. An engine that cannot give them refuses a request asking
for them at `add_request` (InvalidRequest, saying so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from runtime.engine import Sequence
from runtime.engine.abi import CacheAbi
from runtime.engine.sampler import SamplingParams

LayerWritten = Callable[[int, int, int], None]
"""on_layer(layer, token_start, token_end): that layer's K/V for those tokens is in the cache."""


@runtime_checkable
class HandOffEngine(Protocol):
    """The engine operations the workers use (module docstring: who calls each, when)."""

    abi: CacheAbi
    """The cache's layout, model and numerics: what K/V bytes mean, by digest."""
    max_model_len: int
    """The most tokens, prompt and output, one sequence may hold."""
    streams_layers: bool
    """Whether a prefill's K/V should leave layer by layer as it is written, by default
    (PD_STREAM_LAYERS unset): False where the sends would take the compute's own cores."""

    @property
    def block_size(self) -> int:
        """Tokens per K/V block."""

    @property
    def num_free_blocks(self) -> int:
        """Blocks `add_request` can take now (free, or evictable prefix cache)."""

    def blocks_needed(self, prompt_len: int, max_tokens: int) -> int:
        """Blocks a request of this shape holds at most (admission's price)."""

    def add_request(self, request_id: str, prompt_ids: list[int], max_tokens: int,
                    sampling: SamplingParams | None = None, salt: bytes = b"",
                    reuse_prefix: bool = True) -> Sequence:
        """Validate and reserve blocks for prompt + max_tokens, reusing the prefix cache
        within `salt`'s scope (a tenant's); raises InvalidRequest or OutOfBlocks, holding
        nothing then. `seq.num_cached_tokens` says how much came from the cache."""

    def prefill_chunk(self, seq: Sequence, on_layer: LayerWritten | None = None,
                      max_chunk_tokens: int = 0) -> int | None:
        """Compute the next chunk of the prompt; the first output token after its last
        chunk (None before). `on_layer` fires as each layer's K/V of the chunk is final."""

    def decode_step(self, seqs: list[Sequence]) -> list[int]:
        """One token for each sequence (all decoding); the same tokens in any batch."""

    def kv_views(self, seq: Sequence, layer: int, first: int, count: int) -> list[tuple[memoryview, memoryview]]:
        """(K bytes, V bytes) per run of `layer`'s logical blocks [first, first + count): views
        of the cache memory, read by a sender, written by a receiver."""

    def kv_digest(self, seq: Sequence, num_tokens: int | None = None) -> str:
        """The digest of the K/V of token slots [0, num_tokens) (the prompt's by default),
        every layer: equal on both ends of a hand-off, or the K/V differs."""

    def commit_import(self, seq: Sequence, first_token: int) -> None:
        """The sequence's prompt K/V was received and validated: it is the prompt's from here
        on (prefix cache included), and decoding goes on after `first_token`."""

    def free(self, seq: Sequence) -> None:
        """Every block of `seq` back (full prompt blocks stay as prefix cache); idempotent."""
