"""Proto <-> engine conversions and the error -> gRPC status table shared by workers."""

from __future__ import annotations

import grpc

from pdserve_client.rpc.pd.v1 import common_pb2
from runtime.engine import AbiMismatch, FinishReason, InvalidRequest, OutOfBlocks, SamplingParams
from runtime.engine.sampler import TokenLogprobs
from runtime.transfer.base import MissingTransferKey


def sampling_from_proto(p: common_pb2.SamplingParams) -> SamplingParams:
    """Proto sampling params (zero = unset) -> engine SamplingParams; ValueError if invalid."""
    return SamplingParams(
        temperature=p.temperature, top_k=p.top_k, top_p=p.top_p if p.top_p else 1.0,
        seed=p.seed if p.HasField("seed") else 0, stop_token_ids=tuple(p.stop_token_ids),
        ignore_eos=p.ignore_eos, first_step=p.first_step,
        logprobs=p.logprobs if p.HasField("logprobs") else None)


def sampling_to_proto(s: SamplingParams) -> common_pb2.SamplingParams:
    """Engine SamplingParams -> proto."""
    return common_pb2.SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                     seed=s.seed, stop_token_ids=list(s.stop_token_ids),
                                     ignore_eos=s.ignore_eos, first_step=s.first_step, logprobs=s.logprobs)


def logprobs_to_proto(lp: TokenLogprobs | None) -> common_pb2.TokenLogprobs | None:
    """A token's log-probabilities -> proto (None stays None: the field unset)."""
    if lp is None:
        return None
    return common_pb2.TokenLogprobs(logprob=lp.logprob, top_token_ids=[i for i, _ in lp.top],
                                    top_logprobs=[v for _, v in lp.top])


FINISH = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.CONTEXT: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORTED: common_pb2.FINISH_REASON_CANCELLED,
}


def finish_to_proto(reason: str | None) -> int:
    """FinishReason value string (from a sink) -> proto enum."""
    if reason is None:
        return common_pb2.FINISH_REASON_UNSPECIFIED
    return FINISH[FinishReason(reason)]


def status_of(e: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status an engine/worker exception maps to, with its message."""
    if isinstance(e, (InvalidRequest, ValueError)):
        return grpc.StatusCode.INVALID_ARGUMENT, str(e)
    if isinstance(e, OutOfBlocks):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, f"K/V blocks exhausted: {e}"
    if isinstance(e, (AbiMismatch, MissingTransferKey)):
        return grpc.StatusCode.FAILED_PRECONDITION, str(e)
    if isinstance(e, KeyError):
        return grpc.StatusCode.NOT_FOUND, str(e.args[0]) if e.args else "not found"
    return grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}"
