"""VALIDATED and PUBLISHED in the directory for one reservation (the decode worker's
step 3), in one call: the directory is the judge of the K/V. It validates only if this
worker's digest of what it holds is the one the source declared and the chunks that
arrived are the manifest's expected list, then publishes (a CAS on the generation) in
the same store operation; the first refusal is the answer."""

from __future__ import annotations

from pdserve_client import spans as S
from runtime.directory.states import Outcome, TxnState
from runtime.directory.wire import chunk_specs
from runtime.telemetry import tracing
from runtime.worker.directory_ops import DirectoryUnavailable, TxnOps

from .reservations import Reservation


async def publish(txn: TxnOps, res: Reservation, local_digest: str, commit_digest: str,
                  source_seal: bytes = b"") -> str:
    """Directory VALIDATED then PUBLISHED (declared first by `source_seal`, the source's
    from its COMMIT, when it sealed); '' on success, else why not."""
    chunks = chunk_specs(res.received[k] for k in res.expected)
    with tracing.span_in(S.DECODE_PUBLISH, res.trace.context) as span:
        try:
            r = await txn.publish(res.request_id, res.transfer_id, res.generation, local_digest, chunks,
                                  source_seal=source_seal)
        except DirectoryUnavailable as e:
            return tracing.failed(span, f"directory unavailable: {e}")
        if r.ok:
            if source_seal:  # opened by the directory: relayed with token 0 (decode_worker/server.py)
                res.source_seal, res.sealed_chunks = source_seal, tuple(chunks)
            return ""
        digests = (f" (K/V digest here {local_digest[:12]}..., the source's commit says {commit_digest[:12]}...)"
                   if r.outcome is Outcome.CHECKSUM_CONFLICT else "")
        step = "PUBLISH" if r.state is TxnState.VALIDATED else "VALIDATED"  # the move it refused
        return tracing.failed(span, f"directory refused {step}: {r.outcome.name}{digests}")


async def release(txn: TxnOps, res: Reservation) -> None:
    """Directory RELEASED (retried by the ops while the directory is away)."""
    with tracing.span_in(S.DECODE_RELEASE, res.trace.context):
        await txn.release(res.request_id, res.transfer_id, res.generation)
