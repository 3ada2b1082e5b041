"""The trace vocabulary: span names and attribute keys every pdserve process uses
(docs/observability.md), shared by the services that emit spans and `pdctl trace` that reads them.

One request is one trace. Its spans, by process (service.name):

    pdserve-router     router.request            the whole Generate (root, or the client's child)
                         router.decide           route decision: pd.route, predicted TTFT/TPOT
                         router.attempt          one attempt: pd.generation, pd.transfer_id, pd.route;
                                                 events retry{pd.reason}, fallback{pd.reason}
                         <gRPC client spans>     /pd.v1.Decode/Reserve, /pd.v1.Prefill/Prefill, ...
    pdserve-decode     decode.reserve            blocks + directory reservation
                       transfer.receive          reservation ready -> commit received; events
                                                 layer.visible{pd.layer, pd.chunks, pd.bytes},
                                                 one per layer, when its last chunk landed
                       decode.validate, decode.publish, decode.admit,
                       decode.first_token        admitted -> first token out
                       decode.generate           first token -> last token
                       decode.release
    pdserve-prefill    prefill.queue, prefill.compute (one per compute chunk),
                       transfer.send             first chunk handed to the transport -> last one
                                                 sent: pd.layers, pd.chunks, pd.bytes; events
                                                 layer.sent{pd.layer, pd.chunks, pd.bytes}, one
                                                 per layer, when its last chunk left
                       transfer.commit
    pdserve-directory  <gRPC server spans>       /pd.v1.Directory/Begin, /Validated, /Publish, ...

Every span carries pd.request_id (and pd.tenant); pd.generation, pd.transfer_id and
pd.route where they apply. Failures are span status ERROR plus an event naming why.

Exposed transfer, as the seed's transfer-trace analyzer defines it:
    T_exposed = max(0, publish_end - decode_ready)
where publish_end is the end of decode.publish (or, when that came before decode_ready,
the start of decode.admit: a commit sent ahead of the first token publishes while prefill
computes, and the decode waits for the token that follows) and decode_ready the moment decode could
have started had the transfer been free: the later of the decode reservation being ready
(end of decode.reserve) and prefill's last compute chunk ending (end of the last
prefill.compute).
"""

from __future__ import annotations

# ---- attribute keys ---------------------------------------------------------
REQUEST_ID = "pd.request_id"
TENANT = "pd.tenant"
GENERATION = "pd.generation"
TRANSFER_ID = "pd.transfer_id"
ROUTE = "pd.route"
POLICY = "pd.policy"
PREDICTED_TTFT_MS = "pd.predicted_ttft_ms"
PREDICTED_TPOT_MS = "pd.predicted_tpot_ms"
PREFILL_WORKER = "pd.prefill_worker"
DECODE_WORKER = "pd.decode_worker"
PROMPT_TOKENS = "pd.prompt_tokens"
REPLAYED_TOKENS = "pd.replayed_tokens"
"""On router.attempt: outputs a resumed attempt replays as prompt (0: it starts over)."""
LAYER = "pd.layer"
LAYERS = "pd.layers"
CHUNKS = "pd.chunks"
BYTES = "pd.bytes"
REASON = "pd.reason"

REQUEST_ATTRIBUTES = (REQUEST_ID, TENANT, GENERATION, TRANSFER_ID, ROUTE)
"""Carried as W3C baggage from the router, copied onto every span of the request in
every process (runtime/telemetry/tracing.py)."""

# ---- span names ---------------------------------------------------------------
ROUTER_REQUEST = "router.request"
ROUTER_DECIDE = "router.decide"
ROUTER_ATTEMPT = "router.attempt"
ROUTER_MIGRATION = "router.migration"
DECODE_RESERVE = "decode.reserve"
TRANSFER_RECEIVE = "transfer.receive"
DECODE_VALIDATE = "decode.validate"
DECODE_PUBLISH = "decode.publish"
DECODE_ADMIT = "decode.admit"
DECODE_FIRST_TOKEN = "decode.first_token"
DECODE_GENERATE = "decode.generate"
DECODE_RELEASE = "decode.release"
PREFILL_QUEUE = "prefill.queue"
PREFILL_COMPUTE = "prefill.compute"
TRANSFER_SEND = "transfer.send"
TRANSFER_COMMIT = "transfer.commit"

# ---- event names --------------------------------------------------------------
EVENT_RETRY = "retry"
EVENT_FALLBACK = "fallback"
EVENT_LAYER_SENT = "layer.sent"
"""transfer.send: a layer's last chunk left (one event per layer, however many chunks it
took, so a hand-off's trace grows with its layers, not its chunks)."""
EVENT_LAYER_VISIBLE = "layer.visible"
"""transfer.receive: a layer's last chunk is in place (one event per layer)."""
EVENT_FIRST_TOKEN = "first_token"
"""router.request: token 0 left for the client; the Prefill call's span: the prefill's token 0
left for the router, as soon as it was sampled (before its hand-off ends)."""
EVENT_CAPABILITY_DENIED = "capability.denied"
EVENT_REJECTED = "rejected"
EVENT_RESERVED = "reserved"
"""router.attempt: the decode worker's Reserve answered (a disaggregated attempt)."""
EVENT_RECORDED = "recorded"
"""router.attempt: the directory's Reserve answered APPLIED (the transaction is recorded;
the grant and the DecodeStream leave after it)."""
EVENT_GRANTED = "granted"
"""router.attempt: the Prefill's grant went out; the Prefill call's span: it came in."""
EVENT_TOKEN_HELD = "token.held"
"""router.attempt: the decode's token 0 came before the Prefill's reply; its tokens wait for
the prefill's K/V digest (the two are compared before the decode's go out)."""
EVENT_PREFILL_DONE = "prefill.done"
"""router.attempt: the Prefill call returned (the prefill's K/V digest is in)."""

SPANS_FILE = "traces/spans.jsonl"
"""Where the local collector (runtime/telemetry/collector.py) writes, under the state dir."""
