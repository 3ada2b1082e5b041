"""An in-process fake cluster for router orchestration unit tests (FakeCluster: the
worker and directory gateways with scripted failures), and the helpers those tests
share: request parameters, running a request to its end, and `assert_no_leaks`."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable

from pdserve_client.rpc.pd.v1 import blocks_pb2, manifest_pb2
from router.config import RouterConfig
from router.gateway import DirectoryGateway, WorkerGateway
from router.requests.orchestrator import Orchestrator
from router.types import (
    FinishReason,
    GenerateParams,
    PrefillCall,
    PrefillDone,
    Reservation,
    ReserveCall,
    RouterError,
    Started,
    StatusCode,
    StreamCall,
    StreamComplete,
    StreamToken,
    TokenLogprobs,
    TokenOut,
    TxnAnswer,
    WorkerCallError,
)
from runtime.directory.client import ReleaseWrite, RouteEpoch
from runtime.directory.records import (
    ClusterSnapshot,
    LoadReport,
    ReleaseHead,
    WorkerCapacity,
    WorkerRecord,
    WorkerRole,
)
from runtime.directory.states import Outcome
from runtime.directory.wire import evidence_of
from runtime.release.machine import IllegalTransition
from runtime.release.record import ReleaseRecord, check_write
from runtime.security.seal import Sealer

VOCAB = 512
SEALED_CHUNKS = (manifest_pb2.ChunkSpec(layer=0, block_start=0, block_count=2, num_bytes=64, checksum="c0"),
                 manifest_pb2.ChunkSpec(layer=1, block_start=0, block_count=2, num_bytes=64, checksum="c1"))
CAP = WorkerCapacity(total_blocks=64, max_decode_batch=8, max_prefill_tokens=512, block_size=4, vocab_size=VOCAB,
                     max_model_len=256)
PROMPT = (3, 1, 4, 1, 5, 9, 2, 6, 5)


def model_tokens(prompt, n: int, first_step: int = 0) -> list[int]:
    """The fake model: a deterministic function of the prompt (every worker agrees). A
    resumed call's prompt ends with `first_step` outputs (SamplingParams.first_step): the
    n tokens after them, as an uninterrupted run gives them."""
    proper = sum(prompt[:len(prompt) - first_step])
    return [(proper * 31 + 7 * i) % VOCAB for i in range(first_step, first_step + n)]


def model_logprobs(token: int, step: int, k: int | None) -> TokenLogprobs | None:
    """The fake model's log-probabilities of output `step`, `token` (None: not asked, k None):
    a function of both, so every worker agrees, as exact engines do."""
    if k is None:
        return None
    return TokenLogprobs(-(step + 1) / 8, tuple(((token + j) % VOCAB, -j / 4) for j in range(k)))


def worker(worker_id: str, role: WorkerRole, free: int = 64, pending: int = 0) -> WorkerRecord:
    return WorkerRecord(worker_id, role, f"{worker_id}:50", f"{worker_id}:60", "abi-1", CAP,
                        LoadReport(pending_prefill_tokens=pending, free_blocks=free, total_blocks=64), epoch=5,
                        lease_expiry_ms=1)


def unavailable(msg: str = "worker down") -> WorkerCallError:
    return WorkerCallError(StatusCode.UNAVAILABLE, msg)


class FakeCluster(WorkerGateway, DirectoryGateway):
    """Workers and directory in one object; records every call in order.

    Knobs: `fail[(op, worker_id)]` raises on that call; `hang` holds calls
    forever; `break_after[worker_id]` ends a stream with an error after k
    tokens; `diverge[worker_id]` = index where that worker's tokens differ;
    `corrupt_kv`: decode workers whose token 0 reports another K/V digest than prefill's;
    `seal`: (a Sealer, the prefill id and epoch it seals as): token 0 relays its seal over
    the prefill's digest and `SEALED_CHUNKS`, as a decode relays a sealed COMMIT's.
    """

    def __init__(self, workers: list[WorkerRecord]):
        self.cluster = ClusterSnapshot(tuple(workers), route_epoch=7)
        self.calls: list[tuple] = []
        self.fail: dict[tuple[str, str], WorkerCallError] = {}
        self.hang: set[tuple[str, str]] = set()
        self.break_after: dict[str, int] = {}
        self.diverge: dict[str, int] = {}
        self.corrupt_kv: set[str] = set()
        """Decode workers whose published K/V digest differs from the prefill's."""
        self.seal: tuple[Sealer, str, int] | None = None
        self.txn_outcome = Outcome.APPLIED
        self.txns: dict[str, str] = {}
        self.request_generations: dict[str, int] = {}
        """The directory's per-request generation register (reserve refuses at or below it)."""
        self.manifests: list = []
        self.published: dict[str, asyncio.Event] = {}
        self.reserved_prompts: dict[str, tuple[int, ...]] = {}
        """Transfer id -> the prompt its Decode.Reserve named (what its DecodeStream decodes)."""
        self.token_gap_s = 0.0
        self.prefill_token_0 = True
        """The prefill sends token 0 as soon as it is sampled (before publication)."""
        self.token_0_late_s = 0.0
        """The prefill's token 0 reaches the router this long after publication instead (the
        decode's token 0 may come first)."""
        self.after_token: Callable[[int], None] | None = None
        """Called with i right after token i was taken, in the same event-loop step as
        the router's queueing of it (a cancel there races the token)."""
        self.directory_down = False
        """Every directory call raises UNAVAILABLE (an outage)."""
        self.snapshots = 0
        self.deaf: set[str] = set()
        """Workers that never report their connector off (a stuck heartbeat)."""
        self.reserved_blocks: dict[str, int] = {}
        """Worker -> blocks its WorkerAdmin.Blocks answer reports reserved (unpublished)."""
        self.publications_by_epoch: dict[int, int] = {}
        """Route epoch -> transfers published under it (a test raises it to fake a late one)."""
        self.release: ReleaseRecord | None = None
        """The directory's release record (check_write guards it, as the directory's does)."""

    def ops(self, *names: str) -> list[tuple]:
        return [c for c in self.calls if c[0] in names]

    async def _enter(self, op: str, worker_id: str, *rest) -> None:
        self.calls.append((op, worker_id, *rest))
        await asyncio.sleep(0)
        if (op, worker_id) in self.hang:
            await asyncio.Future()
        if (op, worker_id) in self.fail:
            raise self.fail[(op, worker_id)]

    # -- directory
    def _directory_call(self) -> None:
        if self.directory_down:
            raise WorkerCallError(StatusCode.UNAVAILABLE, "directory unreachable")

    async def snapshot(self, timeout_s):
        self.snapshots += 1
        self._directory_call()
        return self.cluster

    async def reserve_txn(self, manifest, timeout_s):
        self.calls.append(("txn_reserve", manifest.transfer_id))
        self._directory_call()
        if self.cluster.release.routes_stopped:
            return TxnAnswer(Outcome.ROUTES_STOPPED, self.request_generations.get(manifest.request_id, 0))
        self.manifests.append(manifest)
        behind = self.request_generations.get(manifest.request_id, 0)
        if self.txn_outcome is Outcome.APPLIED and manifest.generation <= behind:
            return TxnAnswer(Outcome.STALE_GENERATION, behind)  # the id ran before
        if self.txn_outcome is Outcome.APPLIED:
            self.txns[manifest.transfer_id] = "RESERVED"
            self.request_generations[manifest.request_id] = manifest.generation
        return TxnAnswer(self.txn_outcome, self.request_generations.get(manifest.request_id, 0))

    async def abort_txn(self, request_id, transfer_id, generation, reason, timeout_s):
        self.calls.append(("txn_abort", transfer_id, reason))
        if self.txns.get(transfer_id) == "RESERVED":
            self.txns[transfer_id] = "ABORTED"
            return Outcome.APPLIED
        return Outcome.ILLEGAL_TRANSITION

    async def list_open_transactions(self, timeout_s):
        self._directory_call()
        return [manifest_pb2.Transaction(transfer_id=t, request_id=t.partition("/")[0],
                                         generation=int(t.partition("/")[2] or 0),
                                         state=manifest_pb2.TXN_STATE_RESERVED)
                for t, s in self.txns.items() if s == "RESERVED"]

    async def blocks(self, w, request_id, timeout_s):
        await self._enter("blocks", w.worker_id)
        return blocks_pb2.WorkerBlocks(worker_id=w.worker_id, epoch=w.epoch, total_blocks=w.capacity.total_blocks,
                                       reserved_blocks=self.reserved_blocks.get(w.worker_id, 0))

    async def get_release(self, timeout_s):
        self._directory_call()
        return self.release

    async def write_release(self, expected_version, record, timeout_s):
        self.calls.append(("write_release", record.state.name, record.version))
        self._directory_call()
        if (self.release.version if self.release else 0) != expected_version:
            return ReleaseWrite(Outcome.STALE_GENERATION, self.release, "read it again")
        try:
            check_write(self.release, record)
        except IllegalTransition as exc:
            return ReleaseWrite(Outcome.ILLEGAL_TRANSITION, self.release, str(exc))
        self.release = record
        head = ReleaseHead(record.version, int(record.state), record.routes_stopped)
        # The workers learn it at once (their heartbeats, in the real cluster), but the deaf ones.
        workers = tuple(dataclasses.replace(w, load=dataclasses.replace(
            w.load, connector_disabled=int(record.routes_stopped and w.worker_id not in self.deaf)))
                        for w in self.cluster.workers)
        self.cluster = dataclasses.replace(self.cluster, release=head, workers=workers)
        return ReleaseWrite(Outcome.APPLIED, record)

    async def advance_route_epoch(self, expected, reason, timeout_s):
        self.calls.append(("advance_route_epoch", expected))
        self._directory_call()
        if expected and expected != self.cluster.route_epoch:
            return RouteEpoch(self.cluster.route_epoch, False)
        retired = self.cluster.route_epoch
        self.cluster = dataclasses.replace(self.cluster, route_epoch=retired + 1)
        return RouteEpoch(self.cluster.route_epoch, True, self.publications_by_epoch.get(retired, 0))

    async def publications(self, route_epoch, timeout_s):
        self._directory_call()
        return self.publications_by_epoch.get(route_epoch, 0)

    # -- workers
    async def reserve(self, w: WorkerRecord, call: ReserveCall, timeout_s) -> Reservation:
        await self._enter("reserve", w.worker_id, call.request_id, call.generation)
        tid = f"{call.request_id}/{call.generation}"
        self.published[tid] = asyncio.Event()
        self.reserved_prompts[tid] = call.prompt_token_ids
        return Reservation(tid, tuple(range(5)), f"dp-{w.worker_id}", w.worker_id, w.epoch, visible_prefix_blocks=1)

    async def prefill(self, w: WorkerRecord, call: PrefillCall, timeout_s, grant=None, on_first_token=None,
                      job_sent=None) -> PrefillDone:
        if job_sent is not None:  # the job left
            job_sent.set_result(None)
        if grant is not None:  # the job came first; the call goes on once its grant is there
            call = await grant
        await self._enter("prefill", w.worker_id, call.manifest.request_id, call.manifest.generation)
        token = model_tokens(call.prompt_token_ids, 1, call.sampling.first_step)[0]
        send_token_0 = (lambda: on_first_token(token, model_logprobs(token, call.sampling.first_step,
                                                                      call.sampling.logprobs))) \
            if on_first_token is not None and self.prefill_token_0 else (lambda: None)
        if not self.token_0_late_s:
            send_token_0()  # sampled: it leaves before the hand-off ends
        tid = call.manifest.transfer_id
        self.txns[tid] = "PUBLISHED"
        self.published[tid].set()
        if self.token_0_late_s:
            await asyncio.sleep(self.token_0_late_s)
            send_token_0()
        self.prefill_sampling = call.sampling
        return PrefillDone(tid, model_tokens(call.prompt_token_ids, 1, call.sampling.first_step)[0],
                           kv_digest=f"kv:{tid}")

    def _tokens(self, w: WorkerRecord, prompt, n: int, first_step: int) -> list[int]:
        tokens = model_tokens(prompt, n, first_step)
        if w.worker_id in self.diverge and self.diverge[w.worker_id] < n:
            tokens[self.diverge[w.worker_id]] ^= 1
        return tokens

    async def _stream(self, w: WorkerRecord, call: StreamCall, prompt) -> AsyncIterator:
        s = call.sampling
        for i, tok in enumerate(self._tokens(w, prompt, call.max_tokens, s.first_step)):
            if self.break_after.get(w.worker_id) == i:
                raise unavailable(f"{w.worker_id} died mid-stream")
            await asyncio.sleep(self.token_gap_s)
            digest = "" if i or not call.transfer_id else \
                f"kv:{call.transfer_id}" + ("-corrupt" if w.worker_id in self.corrupt_kv else "")
            # A hand-off's token 0 was the prefill's: the decode has no log-probabilities for it.
            logprobs = None if digest else model_logprobs(tok, s.first_step + i, s.logprobs)
            if digest and self.seal is not None:
                sealer, source, epoch = self.seal
                sealed = sealer.seal(call.transfer_id, call.generation, source, epoch,
                                     evidence_of(f"kv:{call.transfer_id}", SEALED_CHUNKS))
                yield StreamToken(tok, i, digest, sealed, SEALED_CHUNKS)
            else:
                yield StreamToken(tok, i, digest, logprobs=logprobs)
            if self.after_token is not None:
                self.after_token(i)
        yield StreamComplete(FinishReason.LENGTH, call.max_tokens, f"kv:{call.transfer_id}" if call.transfer_id else "")

    async def decode_stream(self, w: WorkerRecord, call: StreamCall, timeout_s):
        await self._enter("decode_stream", w.worker_id, call.request_id, call.generation, call.transfer_id)
        await self.published[call.transfer_id].wait()
        async for item in self._stream(w, call, self.reserved_prompts[call.transfer_id]):
            yield item
        self.txns[call.transfer_id] = "RELEASED"

    async def generate(self, w: WorkerRecord, call: StreamCall, timeout_s):
        await self._enter("generate", w.worker_id, call.request_id, call.generation)
        async for item in self._stream(w, call, call.prompt_token_ids):
            yield item

    async def cancel_decode(self, w, request_id, generation, reason, timeout_s, discard_kv=False):
        self.calls.append(("cancel_decode", w.worker_id, request_id, generation) + (("discard_kv",) * discard_kv))
        return True

    async def cancel_prefill(self, w, request_id, generation, reason, timeout_s):
        self.calls.append(("cancel_prefill", w.worker_id, request_id, generation))
        return True


def two_by_two() -> FakeCluster:
    return FakeCluster([worker("p0", WorkerRole.PREFILL), worker("p1", WorkerRole.PREFILL, pending=10),
                        worker("d0", WorkerRole.DECODE, free=60), worker("d1", WorkerRole.DECODE)])


def sealed_cluster(*decodes: str, forged: bool = False) -> FakeCluster:
    """p0 registered a seal key (the snapshot has it); token 0 relays a seal over p0's
    digest, made with that key, or with another one (`forged`)."""
    sealer = Sealer()
    p0 = dataclasses.replace(worker("p0", WorkerRole.PREFILL), seal_key=sealer.public)
    fake = FakeCluster([p0, *(worker(d, WorkerRole.DECODE, free=60 - i) for i, d in enumerate(decodes))])
    fake.seal = (Sealer() if forged else sealer, "p0", p0.epoch)
    return fake


def config(**kw) -> RouterConfig:
    kw.setdefault("snapshot_max_age_ms", 0)
    return RouterConfig(**kw)


def params(request_id="r", max_tokens=6, **kw) -> GenerateParams:
    kw.setdefault("prompt_token_ids", PROMPT)
    kw.setdefault("tenant", "t")
    return GenerateParams(request_id=request_id, max_tokens=max_tokens, **kw)


def run(coro, timeout_s: float = 10.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def collect(orch: Orchestrator, p: GenerateParams) -> tuple[list, RouterError | None]:
    events, error = [], None
    try:
        async for ev in orch.generate(p):
            events.append(ev)
    except RouterError as exc:
        error = exc
    await orch.drain()
    return events, error


def assert_no_leaks(orch: Orchestrator, fake: FakeCluster) -> None:
    assert orch.in_flight == 0
    assert len(orch.inflight) == 0  # router/requests/inflight.py: every load hold and stream booking given back
    assert not [t for t, s in fake.txns.items() if s == "RESERVED"], fake.txns


def tokens_of(events) -> list[tuple[int, int]]:
    return [(e.index, e.token_id) for e in events if isinstance(e, TokenOut)]


def started(events) -> list[Started]:
    return [e for e in events if isinstance(e, Started)]
