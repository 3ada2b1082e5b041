"""The prefill's word on its K/V digest, relayed by the decode with token 0.

The router compares the two ends' K/V digests before the decode's tokens of a hand-off
go out (docs/design.md, "The hand-off is checked against the directory and by the
router"); token 0 itself went out as the prefill sampled it (its own result).
The prefill's digest comes with its Prefill reply, which leaves only after the decode's
verdict: one process and one hop more than token 0's way. A source that declared its
K/V in its COMMIT sealed that declaration (runtime/security/seal.py) with the key it
registered at its epoch, and the directory published only what the seal opens over;
the decode relays the seal and the chunk list with token 0. Opened here with the key
from the router's snapshot, over the decode's digest and that chunk list, the seal is
the prefill's own, unforgeable statement that it computed the digest the decode
published: the comparison is made without waiting for the reply. A relayed seal must
open, whichever of token 0 and the reply came first; where the token brings none (a
source that declared with a Begin) or the snapshot holds no key, the decode's tokens
wait for the reply.
"""

from __future__ import annotations

import functools
import logging

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from router.requests.attempt import Attempt, AttemptFailed, Stage, advance
from router.requests.handoff import transfer_id
from router.types import StatusCode, StreamItem, StreamToken
from runtime.directory.records import WorkerRecord
from runtime.directory.wire import evidence_of
from runtime.security import seal

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1024)
def _key(raw: bytes) -> Ed25519PublicKey | None:
    try:
        return seal.public_key(raw)
    except ValueError:
        return None


def sealed_digest(token: StreamToken, prefill: WorkerRecord, transfer_id: str, generation: int) -> bool | None:
    """None: `token` brings no seal, or the snapshot holds no key for `prefill` (wait for
    its reply); True: the prefill sealed exactly `token`'s digest and chunk list for this
    transfer at its epoch; False: the seal does not open over them (a mismatch)."""
    if not token.source_seal or not token.kv_digest:
        return None
    key = _key(prefill.seal_key) if prefill.seal_key else None
    if key is None:
        return None
    return seal.opens(key, token.source_seal, transfer_id, generation, prefill.worker_id, prefill.epoch,
                      evidence_of(token.kv_digest, token.chunks))


def sealed_token_0(att: Attempt, item: StreamItem, request_id: str) -> bool:
    """Whether `item` is the hand-off's token 0 with the prefill's seal over its digest:
    the comparison made (`att.sealed_kv_digest`), it goes out now. A seal that does not
    open over it is a mismatch: AttemptFailed, the published K/V to be discarded."""
    if not isinstance(item, StreamToken) or item.index != 0 or att.tokens_seen or att.prefill is None:
        return False
    opened = sealed_digest(item, att.prefill, transfer_id(request_id, att.generation), att.generation)
    if opened is None:
        return False
    if not opened:
        stage = att.stage.value
        advance(att, Stage.DIVERGED)
        raise AttemptFailed(stage, StatusCode.ABORTED,
                            f"K/V digest mismatch: {att.prefill.worker_id}'s seal relayed with token 0 does not "
                            f"open over the digest {att.decode.worker_id} published ({item.kv_digest[:16]}); "
                            f"nothing of the decode's was streamed",
                            frozenset({att.prefill.worker_id, att.decode.worker_id}))
    att.sealed_kv_digest = item.kv_digest
    return True


def reply_against_seal(att: Attempt) -> None:
    """The Prefill's reply, come after token 0 went out by the seal: an error logged if its
    digest is not the one the prefill sealed (the prefill contradicts itself)."""
    if att.sealed_kv_digest and att.prefill_kv_digest and att.prefill_kv_digest != att.sealed_kv_digest:
        log.error("%s: %s's reply names K/V digest %s, its seal %s (token 0 went out by the seal)",
                  att.describe(), att.prefill.worker_id if att.prefill else "?", att.prefill_kv_digest[:16],
                  att.sealed_kv_digest[:16])


def reply_against_token(att: Attempt, token: StreamToken) -> None:
    """The decode's token 0 against the Prefill's reply, come first: AttemptFailed (the
    published K/V to be discarded) when their digests differ. Nothing of the decode's was
    streamed; token 0 went out as the prefill's own."""
    if token.kv_digest and att.prefill_kv_digest and token.kv_digest != att.prefill_kv_digest:
        stage = att.stage.value
        advance(att, Stage.DIVERGED)
        raise AttemptFailed(stage, StatusCode.ABORTED,
                            f"K/V digest mismatch: {att.prefill.worker_id} computed {att.prefill_kv_digest[:16]}, "
                            f"{att.decode.worker_id} published {token.kv_digest[:16]}; nothing of the decode's was "
                            "streamed", frozenset({att.prefill.worker_id, att.decode.worker_id}))
