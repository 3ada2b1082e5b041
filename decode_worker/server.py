"""Decode gRPC servicer: proto -> DecodeWorker -> proto, nothing else."""

from __future__ import annotations

import asyncio
import time

import grpc

from pdserve_client.rpc.pd.v1 import common_pb2, decode_pb2, decode_pb2_grpc, manifest_pb2
from runtime.worker.convert import finish_to_proto, logprobs_to_proto, sampling_from_proto, status_of
from runtime.worker.loop import TokenOut

from .reservations import Reservation, ResState
from .worker import DecodeWorker

_STATE = {
    ResState.RESERVED: manifest_pb2.TXN_STATE_RESERVED,
    ResState.RECEIVING: manifest_pb2.TXN_STATE_TRANSFERRING,
    ResState.PUBLISHED: manifest_pb2.TXN_STATE_PUBLISHED,
    ResState.FINISHED: manifest_pb2.TXN_STATE_RELEASED,
    ResState.ABORTED: manifest_pb2.TXN_STATE_ABORTED,
}


class DecodeServicer(decode_pb2_grpc.DecodeServicer):
    """Serves `pd.v1.Decode` for one DecodeWorker."""

    def __init__(self, worker: DecodeWorker, worker_id: str, epoch_fn):
        self.worker = worker
        self.worker_id = worker_id
        self.epoch_fn = epoch_fn

    async def Reserve(self, request, context):
        if not request.request_id or request.generation == 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "request_id and a generation >= 1 are required")
        try:
            sampling = sampling_from_proto(request.sampling)
            res = await self.worker.reserve(
                request.request_id, request.tenant or "default", request.generation,
                list(request.prompt_token_ids), request.max_tokens, sampling,
                request.cache_abi_digest, request.transfer_key)
        except Exception as e:  # noqa: BLE001 - mapped to a precise status
            await context.abort(*status_of(e))
        return decode_pb2.DecodeReserveResponse(
            request_id=request.request_id,
            reservation=decode_pb2.DecodeReservation(
                reservation_id=res.transfer_id, block_ids=res.seq.block_table,
                data_plane_address=self.worker.receiver.address,
                destination_worker_id=self.worker_id, destination_epoch=self.epoch_fn(),
                visible_prefix_blocks=res.first_block,
                ttl_ms=int(self.worker.cfg.reservation_ttl_s * 1000),
                expected_chunks=[manifest_pb2.ChunkSpec(layer=layer, block_start=start, block_count=count,
                                                        num_bytes=nbytes)
                                 for layer, start, count, nbytes in res.expected_layouts()]))

    async def TransferStatus(self, request, context):
        res = self.worker.reservations.get(request.transfer_id)
        if res is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                self.worker.ended.get(request.transfer_id,
                                                      f"no reservation {request.transfer_id}"))
        return decode_pb2.TransferStatusResponse(
            request_id=res.request_id, transfer_id=res.transfer_id, state=_STATE[res.state],
            chunks_received=len(res.received),
            chunks_expected=len(res.expected),
            received_bytes=sum(a.num_bytes for a in res.received.values()),
            expected_bytes=res.expected_bytes,
            reserved_kv_digest=await self.worker.loop.call(lambda e: e.kv_digest(res.seq)))

    async def DecodeStream(self, request, context):
        started = time.perf_counter()
        res = self.worker.find(request.transfer_id)
        if res is not None:
            self.worker.check_ahead(res, request.capability)
        try:
            async for event in self._events(request.request_id,
                                            self.worker.stream(request.transfer_id), started, res):
                yield event
        except (KeyError, RuntimeError) as e:
            code = grpc.StatusCode.NOT_FOUND if isinstance(e, KeyError) else grpc.StatusCode.ABORTED
            await context.abort(code, str(e.args[0]) if e.args else str(e))

    async def Generate(self, request, context):
        started = time.perf_counter()
        if not request.request_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id is required")
        try:
            sampling = sampling_from_proto(request.sampling)
            items = self.worker.generate(
                request.request_id, request.tenant or "default", max(request.generation, 1),
                list(request.prompt_token_ids), request.max_tokens, sampling)
            async for event in self._events(request.request_id, items, started):
                yield event
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            await context.abort(*status_of(e))

    async def _events(self, request_id: str, items, started: float, res: Reservation | None = None):
        """TokenEvents of `items`; a hand-off's (`res`) token 0 and complete event carry the
        published digest, token 0 the source's relayed seal and the chunks it covers."""
        first_ms = 0.0
        n = 0
        async for item in items:
            now_ms = (time.perf_counter() - started) * 1000
            if isinstance(item, TokenOut):
                first_ms = first_ms or now_ms
                n += 1
                token = decode_pb2.TokenEvent.Token(token_id=item.token_id, index=item.index,
                                                    time_since_start_ms=now_ms,
                                                    logprobs=logprobs_to_proto(item.logprobs))
                if item.index == 0 and res is not None:
                    token.kv_digest = res.kv_digest
                    if res.source_seal:
                        token.source_seal = res.source_seal
                        token.chunks.extend(res.sealed_chunks)
                yield decode_pb2.TokenEvent(request_id=request_id, token=token)
            else:
                if item.error is not None:
                    raise RuntimeError(f"generation failed: {item.error!r}")
                yield decode_pb2.TokenEvent(request_id=request_id, complete=decode_pb2.TokenEvent.Complete(
                    finish_reason=finish_to_proto(item.finish_reason), num_tokens=n, first_token_ms=first_ms,
                    total_ms=now_ms, kv_digest=res.kv_digest if res is not None else ""))

    async def Cancel(self, request, context):
        found = await self.worker.cancel(request.request_id, request.generation,
                                         request.reason or "cancelled by caller", discard_kv=request.discard_kv)
        return common_pb2.CancelResponse(request_id=request.request_id, found=found)
