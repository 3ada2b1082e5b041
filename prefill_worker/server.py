"""Prefill gRPC servicer: proto -> PrefillWorker -> proto."""

from __future__ import annotations

import asyncio

import grpc

from pdserve_client.rpc.pd.v1 import common_pb2, prefill_pb2, prefill_pb2_grpc
from services.directory.wire import chunk_layouts
from services.security.capability import CapabilityDenied
from services.transfer import TransferError
from services.worker.convert import sampling_from_proto, status_of
from services.worker.directory_ops import DirectoryUnavailable

from .worker import PrefillWorker, TransferRefused


class PrefillServicer(prefill_pb2_grpc.PrefillServicer):
    """Serves `pd.v1.Prefill` for one PrefillWorker."""

    def __init__(self, worker: PrefillWorker):
        self.worker = worker

    async def Prefill(self, request, context):
        m = request.manifest
        if not m.request_id or not m.transfer_id or m.generation == 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "manifest needs request_id, transfer_id and generation >= 1")
        if not request.destination_data_plane_address:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "destination_data_plane_address is empty")
        try:
            out = await self.worker.prefill(
                request_id=m.request_id, tenant=m.tenant or "default", generation=m.generation,
                transfer_id=m.transfer_id, first_token_pos=m.token_interval.start,
                prompt=list(request.prompt_token_ids), sampling=sampling_from_proto(request.sampling),
                dest=request.destination_data_plane_address, abi_digest=m.cache_abi_digest,
                chunks=chunk_layouts(m.expected_chunks),
                dest_worker=m.destination_worker_id, manifest=m, capability=request.capability)
        except asyncio.CancelledError as e:
            if context.cancelled():
                raise
            await context.abort(grpc.StatusCode.CANCELLED, str(e) or "cancelled")
        except CapabilityDenied as e:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"CAPABILITY_DENIED {e.reason.value}: {e}")
        except TransferRefused as e:
            await context.abort(grpc.StatusCode.ABORTED, str(e))
        except (TransferError, DirectoryUnavailable) as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"transfer failed: {e}")
        except Exception as e:  # noqa: BLE001
            await context.abort(*status_of(e))
        return prefill_pb2.PrefillResult(
            request_id=m.request_id, transfer_id=out.transfer_id,
            computed_tokens=out.computed_tokens, reused_tokens=out.reused_tokens,
            kv_digest=out.kv_digest, sent_bytes=out.sent_bytes, sent_chunks=out.sent_chunks,
            first_token_id=out.first_token,
            timings=prefill_pb2.PrefillTimings(queue_ms=out.queue_ms, compute_ms=out.compute_ms,
                                               transfer_ms=out.transfer_ms, total_ms=out.total_ms))

    async def Cancel(self, request, context):
        found = await self.worker.cancel(request.request_id, request.generation)
        return common_pb2.CancelResponse(request_id=request.request_id, found=found)
