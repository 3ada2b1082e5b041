"""The failure-injection smoke of a promotion (docs/design.md, The release), driven against the live
workers and directory through this router's own gateways, the calls its attempts make:

    bad_capability    a hand-off reserved for real (decode blocks, a directory transaction)
                      whose capability prefill is shown forged — its signature broken, then a
                      genuine one of another transfer: prefill must refuse both
                      PERMISSION_DENIED before it reads any K/V
    stale_completion  a hand-off superseded in the directory by a newer generation of its
                      request before prefill runs it with its genuine capability: it must not
                      complete, and its transaction must stay aborted (never published)
    mid_transfer      a genuine hand-off cut as the router cuts an attempt (its transaction
                      aborted, both ends cancelled) once prefill is seen working on it: the
                      cut must land before publication

Every probe then checks that it left nothing: no block held for it on either worker
(WorkerAdmin.Blocks, within `SETTLE_S`) and no transaction of it open. A probe that
cannot run (no pair, capabilities off) fails: the gate never passes unevaluated.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
from collections.abc import Awaitable, Callable

from pdserve_client.rpc.pd.v1 import blocks_pb2
from router.gateway import WorkerGateway
from router.release.probes import TENANT, probe_id
from router.requests.handoff import build_manifest, transfer_id
from router.types import PrefillCall, Reservation, ReserveCall, Sampling, StatusCode, StreamCall, WorkerCallError
from runtime.directory.records import WorkerRecord, WorkerRole
from runtime.directory.states import Outcome
from runtime.transfer.keys import new_key

MAX_TOKENS = 2
SETTLE_S = 10.0
"""How long a probe's blocks may take to come back after its teardown."""
CUT_TRIES = 5
"""Fresh hand-offs the mid-transfer cut may take to land before publication."""
CUT_PROMPT_TOKENS = 2048
"""The longest prompt the mid-transfer cut sends (the longest both ends accept, within a
quarter of the decode's free blocks): a short one's hand-off is over in milliseconds."""
_WORKING = frozenset({blocks_pb2.BLOCK_HOLD_STATE_PREFILLING, blocks_pb2.BLOCK_HOLD_STATE_SENDING,
                      blocks_pb2.BLOCK_HOLD_STATE_RECEIVING})
"""Holding states of a hand-off under way (prefill computing or sending, decode receiving)."""


class SmokeFailed(RuntimeError):
    """A probe saw the system accept or keep what it must refuse or free (in words)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    name: str
    passed: bool
    detail: str


@dataclasses.dataclass
class Probe:
    """One probe request's hand-off pieces, for its teardown."""

    ctl: object
    prefill: WorkerRecord
    decode: WorkerRecord
    prompt: tuple[int, ...]
    request_id: str = dataclasses.field(default_factory=lambda: probe_id("release-smoke"))
    generations: list[int] = dataclasses.field(default_factory=list)
    """Generations reserved in the directory (each aborted at teardown)."""
    keys: dict[int, bytes] = dataclasses.field(default_factory=dict)
    """Each generation's transfer key, as an attempt's (runtime/transfer/keys.py)."""

    @property
    def workers(self) -> WorkerGateway:
        return self.ctl.orch.workers

    def _t(self, name: str) -> float:
        return getattr(self.ctl.config, name)

    async def open(self, generation: int = 1) -> tuple[Reservation, object]:
        """Decode.Reserve, then Directory.Reserve of the manifest: a hand-off ready for prefill."""
        p, d = self.prefill, self.decode
        key = self.keys.setdefault(generation, new_key())
        reservation = await self.workers.reserve(d, ReserveCall(
            self.request_id, TENANT, generation, self.prompt, MAX_TOKENS, Sampling(), p.cache_abi_digest, key),
                                                 self._t("reserve_timeout_s"))
        manifest = await self.reserve_txn(reservation, generation)
        return reservation, manifest

    async def manifest(self, reservation: Reservation, generation: int):
        cluster = await self.ctl.orch.view.get(max_age_s=0.0)
        return build_manifest(request_id=self.request_id, tenant=TENANT, generation=generation,
                              prompt=self.prompt, prefill=self.prefill, decode=self.decode,
                              reservation=reservation, route_epoch=cluster.route_epoch)

    async def reserve_txn(self, reservation: Reservation, generation: int):
        manifest = await self.manifest(reservation, generation)
        answer = await self.ctl.orch.directory.reserve_txn(manifest, self._t("directory_timeout_s"))
        if answer.outcome is not Outcome.APPLIED:
            raise SmokeFailed(f"the directory refused the probe's reservation: {answer.outcome.name}")
        self.generations.append(generation)
        return manifest

    async def prefill_call(self, manifest, reservation: Reservation, capability: bytes):
        """Prefill.Prefill of the hand-off with `capability`."""
        return await self.workers.prefill(self.prefill, PrefillCall(
            manifest, self.prompt, reservation.data_plane_address or self.decode.data_plane_address, Sampling(),
            capability, self.keys.get(manifest.generation, b"")), self._t("prefill_timeout_s"))

    def decode_stream(self, generation: int, capability: bytes):
        return self.workers.decode_stream(self.decode, StreamCall(
            self.request_id, generation, MAX_TOKENS, Sampling(), transfer_id=transfer_id(self.request_id, generation),
            capability=capability), self._t("prefill_timeout_s"))

    async def abort(self, generation: int) -> Outcome:
        return await self.ctl.orch.directory.abort_txn(self.request_id, transfer_id(self.request_id, generation),
                                                       generation, "release smoke", self._t("cancel_timeout_s"))

    async def teardown(self) -> None:
        """What the router's attempt teardown does: abort each transaction, cancel both ends."""
        for g in self.generations:
            await self.abort(g)
        limit = self._t("cancel_timeout_s")
        for g in self.generations or [1]:
            with contextlib.suppress(WorkerCallError):
                await self.workers.cancel_decode(self.decode, self.request_id, g, "release smoke", limit)
            with contextlib.suppress(WorkerCallError):
                await self.workers.cancel_prefill(self.prefill, self.request_id, g, "release smoke", limit)

    async def holdings(self) -> dict[str, list]:
        """Each end's holdings of the probe request (raises SmokeFailed if one cannot say)."""
        out = {}
        for w in (self.prefill, self.decode):
            try:
                answer = await self.workers.blocks(w, self.request_id, self._t("directory_timeout_s"))
            except WorkerCallError as exc:
                raise SmokeFailed(f"cannot read {w.worker_id}'s blocks: {exc.code.name}: {exc.message}") from None
            out[w.worker_id] = [h for h in answer.holdings if h.request_id == self.request_id]
        return out

    async def left_nothing(self) -> None:
        """No block held for the probe on either end (waits `SETTLE_S`), no transaction open."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + SETTLE_S
        while held := {w: hs for w, hs in (await self.holdings()).items() if hs}:
            if loop.time() >= give_up:
                raise SmokeFailed("; ".join(f"{w} still holds {sum(h.num_blocks for h in hs)} blocks for it"
                                            for w, hs in held.items()) + f" {SETTLE_S:g} s after its teardown")
            await asyncio.sleep(0.05)
        open_txns = [t for t in await self.ctl.orch.directory.list_open_transactions(
            self._t("directory_timeout_s")) if t.request_id == self.request_id]
        if open_txns:
            raise SmokeFailed(f"{len(open_txns)} of its transactions still open")


async def failure_injection_smoke(ctl) -> tuple[bool, str]:
    """Run the three probes; (all passed, one line per probe)."""
    if ctl.orch.mint is None:
        return False, "transfer capabilities are off (an insecure cluster): a forged one cannot be refused"
    pair = await hand_off_pair(ctl)
    if pair is None:
        return False, ("no live prefill and decode worker with one cache ABI and its connector on to drive a "
                       "hand-off between")
    verdicts = [await _run(ctl, pair, name, probe) for name, probe in
                (("bad_capability", bad_capability), ("stale_completion", stale_completion),
                 ("mid_transfer", mid_transfer))]
    return all(v.passed for v in verdicts), "; ".join(
        f"{v.name} {'ok' if v.passed else 'FAILED'}: {v.detail}" for v in verdicts)


async def hand_off_pair(ctl) -> tuple[WorkerRecord, WorkerRecord] | None:
    """A live prefill and decode worker that may hand off between them (the most free
    blocks). Right after a rollback's PINNED the workers learn that routes reopened at
    their next heartbeat and report their connector on in the one after: wait for that,
    up to rollback_connector_timeout_s."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + ctl.config.rollback_connector_timeout_s
    while True:
        cluster = await ctl.orch.view.get(max_age_s=0.0)
        able = [w for w in cluster.workers if not w.colocated_only_reason and not w.load.connector_disabled]
        by_room = sorted(able, key=lambda w: -w.load.free_blocks)
        for p in (w for w in by_room if w.role in (WorkerRole.PREFILL, WorkerRole.MIXED)):
            for d in (w for w in by_room if w.role in (WorkerRole.DECODE, WorkerRole.MIXED)):
                if d.worker_id != p.worker_id and d.cache_abi_digest == p.cache_abi_digest:
                    return p, d
        if loop.time() >= give_up:
            return None
        await asyncio.sleep(0.1)


def probe_prompt(prefill: WorkerRecord, decode: WorkerRecord) -> tuple[int, ...]:
    """A prompt of a few blocks that both ends accept (token ids every vocabulary has)."""
    length, vocab = _prompt_limits(prefill, decode, 256)
    return tuple(3 + (i * 7) % (vocab - 3) for i in range(length))


def cut_prompt(prefill: WorkerRecord, decode: WorkerRecord) -> tuple[int, ...]:
    """A long prompt of random token ids: no prefix of it is cached, so prefill computes
    (and sends) all of it, long enough for the cut to find it under way."""
    room = decode.load.free_blocks // 4 * (decode.capacity.block_size or 16)
    length, vocab = _prompt_limits(prefill, decode, max(256, min(CUT_PROMPT_TOKENS, room)))
    return tuple(3 + secrets.randbelow(vocab - 3) for _ in range(length))


def _prompt_limits(prefill: WorkerRecord, decode: WorkerRecord, cap: int) -> tuple[int, int]:
    """(prompt length both ends accept, at most `cap`; vocabulary both ends have). A prompt
    longer than max_prefill_tokens is computed in chunks of it."""
    caps = (prefill.capacity, decode.capacity)
    limit = min([c.max_model_len - MAX_TOKENS - 1 for c in caps if c.max_model_len] + [cap])
    return max(limit, 1), min([c.vocab_size for c in caps if c.vocab_size] + [256])


async def _run(ctl, pair, name: str, probe: Callable[[Probe], Awaitable[str]]) -> Verdict:
    p, d = pair
    job = Probe(ctl, p, d, probe_prompt(p, d))
    try:
        try:
            detail = await probe(job)
        finally:
            await job.teardown()
        await job.left_nothing()
    except SmokeFailed as exc:
        return Verdict(name, False, f"{exc} ({job.request_id} on {p.worker_id} -> {d.worker_id})")
    except WorkerCallError as exc:
        return Verdict(name, False, f"the probe could not run: {exc.code.name}: {exc.message}")
    return Verdict(name, True, detail)


async def bad_capability(job: Probe) -> str:
    reservation, manifest = await job.open()
    genuine = job.ctl.orch.mint(manifest, reservation)
    forged = genuine[:-1] + bytes([genuine[-1] ^ 0x01])
    other = job.ctl.orch.mint(await job.manifest(reservation, 2), reservation)  # signed, for generation 2
    seen = []
    for what, capability in (("a broken signature", forged), ("another transfer's capability", other)):
        try:
            await job.prefill_call(manifest, reservation, capability)
        except WorkerCallError as exc:
            if exc.code is not StatusCode.PERMISSION_DENIED:
                raise SmokeFailed(f"prefill answered {what} {exc.code.name}, not PERMISSION_DENIED: "
                                  f"{exc.message}") from None
            seen.append(exc.message.split(":")[0])
            continue
        raise SmokeFailed(f"prefill ran the hand-off on {what}")
    return f"prefill refused a broken signature and another transfer's capability ({'; '.join(seen)})"


async def stale_completion(job: Probe) -> str:
    reservation, manifest = await job.open(generation=1)
    capability = job.ctl.orch.mint(manifest, reservation)
    await job.reserve_txn(reservation, 2)  # a newer generation supersedes generation 1
    # The router's stream, as it sends it once the record is there (the decode publishes only after it).
    stream = asyncio.ensure_future(_drain(job.decode_stream(1, capability)))
    try:
        done = await job.prefill_call(manifest, reservation, capability)
    except WorkerCallError as exc:
        refused = f"{exc.code.name}: {exc.message}"
    else:
        raise SmokeFailed(f"the superseded generation completed its hand-off (K/V digest {done.kv_digest[:12]})")
    finally:
        stream.cancel()
        await asyncio.gather(stream, return_exceptions=True)
    outcome = await job.abort(1)
    if outcome is not Outcome.DUPLICATE:  # DUPLICATE: it was already aborted (superseded), never published
        raise SmokeFailed(f"generation 1's transaction was not left aborted: abort answered {outcome.name}")
    return f"the superseded generation was refused ({refused[:120]}) and never published"


async def mid_transfer(job: Probe) -> str:
    missed: list[str] = []
    for attempt in range(1, CUT_TRIES + 1):
        if attempt > 1:
            await job.teardown()
            await job.left_nothing()
            job.request_id, job.generations = probe_id("release-smoke"), []
        job.prompt = cut_prompt(job.prefill, job.decode)
        reservation, manifest = await job.open()
        capability = job.ctl.orch.mint(manifest, reservation)
        stream = asyncio.ensure_future(_drain(job.decode_stream(1, capability)))
        prefill = asyncio.ensure_future(job.prefill_call(manifest, reservation, capability))
        try:
            seen = await _under_way(job, prefill)
            # The router's cut: abort the transaction first, then cancel both ends.
            cut = await job.abort(1) if seen else None
        finally:
            for task in (prefill, stream):
                task.cancel()
            await asyncio.gather(prefill, stream, return_exceptions=True)
        if cut is Outcome.APPLIED:
            return (f"cut while {seen} (attempt {attempt}, {len(job.prompt)}-token prompt"
                    + (f"; missed: {', '.join(missed)})" if missed else ")")
                    + "; its transaction aborted before publication")
        missed.append(f"abort after {seen} answered {cut.name}" if seen else "done before seen under way")
    raise SmokeFailed(f"in {CUT_TRIES} hand-offs ({len(job.prompt)}-token prompts) the cut never landed "
                      f"before publication: {'; '.join(missed)}")


async def _under_way(job: Probe, prefill: asyncio.Future) -> str:
    """The first working state seen on either end while `prefill` runs ('' if it ended first)."""
    while not prefill.done():
        for worker_id, holdings in (await job.holdings()).items():
            for h in holdings:
                if h.state in _WORKING:
                    state = blocks_pb2.BlockHoldState.Name(h.state).removeprefix("BLOCK_HOLD_STATE_")
                    return f"{worker_id} was {state}"
    return ""


async def _drain(stream) -> None:
    with contextlib.suppress(WorkerCallError):
        async for _ in stream:
            pass
