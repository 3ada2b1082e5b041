"""Prefill gRPC servicer: proto -> PrefillWorker -> proto."""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry import trace

from pdserve_client.rpc.pd.v1 import common_pb2, prefill_pb2, prefill_pb2_grpc
from pdserve_client.spans import EVENT_FIRST_TOKEN, EVENT_GRANTED
from runtime.directory.wire import chunk_layouts
from runtime.engine import InvalidRequest
from runtime.security.capability import CapabilityDenied
from runtime.transfer import TransferError
from runtime.worker.convert import logprobs_to_proto, sampling_from_proto, status_of
from runtime.worker.directory_ops import DirectoryUnavailable
from runtime.worker.loop import TokenOut

from .commit import settle
from .handoff import TransferRefused
from .worker import PrefillWorker, Target


class PrefillServicer(prefill_pb2_grpc.PrefillServicer):
    """Serves `pd.v1.Prefill` for one PrefillWorker."""

    def __init__(self, worker: PrefillWorker):
        self.worker = worker

    async def Prefill(self, request_iterator, context):
        """Token 0 as soon as it is sampled (FirstToken), then the result once the destination
        accepted the commit: the router streams token 0 while the hand-off goes on."""
        requests = aiter(request_iterator)
        request = await anext(requests, None)
        if request is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Prefill: no request (the job comes first)")
        m = request.manifest
        if not m.request_id or not m.transfer_id or m.generation == 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "manifest needs request_id, transfer_id and generation >= 1")
        # One request with its destination is the job and its grant; without, the grant follows.
        if request.destination_data_plane_address:
            target = asyncio.get_running_loop().create_future()
            target.set_result(_target(request))
        else:
            target = asyncio.ensure_future(_grant(m, requests))
        token: asyncio.Future[TokenOut] = asyncio.get_running_loop().create_future()  # sampled once
        run = None
        try:
            run = asyncio.ensure_future(self.worker.prefill(
                request_id=m.request_id, tenant=m.tenant or "default", generation=m.generation,
                transfer_id=m.transfer_id, prompt=list(request.prompt_token_ids),
                sampling=sampling_from_proto(request.sampling), abi_digest=m.cache_abi_digest, target=target,
                on_first_token=token.set_result))
            await asyncio.wait((run, token), return_when=asyncio.FIRST_COMPLETED)
            if token.done():
                trace.get_current_span().add_event(EVENT_FIRST_TOKEN)  # the call's span
                first = token.result()
                yield prefill_pb2.PrefillEvent(first_token=prefill_pb2.FirstToken(
                    token_id=first.token_id, logprobs=logprobs_to_proto(first.logprobs)))
            out = await run
        except grpc.aio.AbortError:  # a malformed grant (MalformedRequests) ended the call already
            raise
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
        finally:
            await settle(run)  # the call is over (cancelled, or its reply could not be sent)
            await settle(target)  # a grant still awaited: the call is over
        yield prefill_pb2.PrefillEvent(result=prefill_pb2.PrefillResult(
            request_id=m.request_id, transfer_id=out.transfer_id,
            computed_tokens=out.computed_tokens, reused_tokens=out.reused_tokens,
            kv_digest=out.kv_digest, sent_bytes=out.sent_bytes, sent_chunks=out.sent_chunks,
            first_token_id=out.first_token,
            timings=prefill_pb2.PrefillTimings(queue_ms=out.queue_ms, compute_ms=out.compute_ms,
                                               transfer_ms=out.transfer_ms, total_ms=out.total_ms)))

    async def Cancel(self, request, context):
        found = await self.worker.cancel(request.request_id, request.generation)
        return common_pb2.CancelResponse(request_id=request.request_id, found=found)


def _target(request: prefill_pb2.PrefillRequest) -> Target:
    """The destination half of a PrefillRequest that carries one."""
    m = request.manifest
    return Target(request.destination_data_plane_address, m.token_interval.start, chunk_layouts(m.expected_chunks),
                  m, request.capability, request.transfer_key)


async def _grant(job, requests) -> Target:
    """The second request of a call whose first was the job alone: the grant, naming the
    job's transfer and its destination (what follows it is not read)."""
    request = await anext(requests, None)
    if request is None:
        raise InvalidRequest(f"Prefill {job.transfer_id}: the call ended without a grant "
                             "(a request with destination_data_plane_address)")
    m = request.manifest
    if (m.request_id, m.generation, m.transfer_id, m.tenant) != (job.request_id, job.generation, job.transfer_id,
                                                                 job.tenant):
        raise InvalidRequest(f"Prefill {job.transfer_id}: the grant names transfer {m.transfer_id!r} "
                             f"(request {m.request_id!r}, generation {m.generation}, tenant {m.tenant!r}), "
                             "not the job's")
    if not request.destination_data_plane_address:
        raise InvalidRequest(f"Prefill {job.transfer_id}: the grant's destination_data_plane_address is empty")
    trace.get_current_span().add_event(EVENT_GRANTED)  # the call's span (this task runs in its context)
    return _target(request)
