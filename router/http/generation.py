"""One generation request over HTTP, from submission to its last byte (an ASGI app).

    submit -> (Started...) -> first token: status 200, headers, first chunk -> chunks
           -> Completed: finish_reason, usage -> [DONE]
    a refusal or failure before the first token: its own HTTP status (errors.py);
    after it, a stream has already said 200: an SSE `error` event ends it.

Headers wait for the first token, so a request refused in the admission queue or by
every worker still gets its status (429, 503, 504), and the headers can carry the route
taken and the router's own TTFT (`x-pdserve-route`, `x-pdserve-ttft-ms`).

Safety invariant: whatever way this ends (the last byte sent, a stop string, an error,
the client gone: `http.disconnect` is watched from the start), `run.cancel` runs in
`finally`, so the request's attempt tears down and every block it held comes back
(router/requests/orchestrator.py; a no-op once the request finished).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from opentelemetry import trace

from router.requests.orchestrator import Orchestrator
from router.requests.request_run import RequestRun
from router.types import Completed, FinishReason, GenerateParams, RouterError, Started, TokenOut
from runtime.telemetry import tracing

from .errors import ApiError, from_router
from .logprobs import LogprobsFormat
from .reply import DONE, Shape, sse
from .stops import StopText

FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.CANCELLED: "abort"}


@dataclasses.dataclass(slots=True)
class Job:
    """An admitted-to-be request as the front built it."""

    params: GenerateParams
    shape: Shape
    stream: bool
    stops: tuple[str, ...] = ()
    echo: str = ""
    """Text before the completion's own (completions' `echo`: the prompt)."""
    trace_context: object | None = None
    """The HTTP request's span context (a child of the client's traceparent)."""
    logprobs: LogprobsFormat | None = None
    """How the tokens' logprobs are given (None: the request asked none)."""


@dataclasses.dataclass(slots=True)
class Progress:
    """What a generation has produced so far."""

    route: str = ""
    ttft_ms: float | None = None
    tokens: int = 0
    text: list[str] = dataclasses.field(default_factory=list)
    completed: Completed | None = None
    logprobs: list[dict] = dataclasses.field(default_factory=list)
    """Entries of the tokens not yet given to the client (all of them, for a whole answer)."""
    offset: int = 0
    """Where the next token's text starts in the completion's (echo included)."""

    def take_logprobs(self, fmt: LogprobsFormat | None) -> dict | None:
        """The `logprobs` object of the entries not yet given, which are given now."""
        if fmt is None or not self.logprobs:
            return None
        block, self.logprobs = fmt.block(self.logprobs), []
        return block


class Generation:
    """The ASGI response of one generation request."""

    def __init__(self, orchestrator: Orchestrator, job: Job):
        self._orch = orchestrator
        self.job = job
        self._run: RequestRun | None = None
        self._gone = False
        self._sent_start = False

    async def __call__(self, scope, receive, send) -> None:
        watcher = asyncio.create_task(self._watch(receive), name="http disconnect")
        span = self._span(scope)
        stopped = False
        try:
            stopped = await self._serve(send)
        except ApiError as err:
            if span is not None:
                tracing.failed(span, f"HTTP {err.status}: {err.message}")
            await self._error(send, err)
        finally:
            if span is not None:
                span.end()
            watcher.cancel()
            if self._run is not None:  # a no-op once the request finished
                self._run.cancel(*(("stop string matched", FinishReason.STOP) if stopped else ("client went away",)))

    def _span(self, scope):
        """The request's SERVER span at the router (a child of the client's traceparent; the
        parent of its router.request span), as the gRPC front's Generate span is; None
        while tracing is off."""
        if not tracing.enabled():
            return None
        name = f"{scope.get('method', 'POST')} {scope.get('path', '')}"
        span = tracing.tracer().start_span(name, context=self.job.trace_context, kind=trace.SpanKind.SERVER,
                                           attributes={"http.request.method": scope.get("method", ""),
                                                       "url.path": scope.get("path", "")})
        self.job.trace_context = trace.set_span_in_context(span, self.job.trace_context)
        return span

    async def _watch(self, receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._gone = True
        if self._run is not None:
            self._run.cancel("client disconnected")

    async def _submit(self) -> RequestRun:
        with tracing.attached(self.job.trace_context):
            try:
                run = await self._orch.submit(self.job.params)
            except RouterError as exc:
                raise from_router(exc) from None
        self._run = run
        if self._gone:
            run.cancel("client disconnected")
        return run

    async def _serve(self, send) -> bool:
        """Serve the request; True when a stop string ended it (its run is still going)."""
        run = await self._submit()
        progress, stop = Progress(offset=len(self.job.echo)), StopText(self.job.stops)
        async for text in self._texts(run, progress, stop):
            if self.job.stream:
                await self._chunk(send, progress, text)
            else:
                progress.text.append(text)
        finish = "stop" if stop.stopped else FINISH[progress.completed.finish_reason]
        await self._end(send, progress, finish)
        return stop.stopped is not None

    async def _texts(self, run: RequestRun, progress: Progress, stop: StopText) -> AsyncIterator[str]:
        """The text the client sees, piece by piece (one per token, maybe empty), until a stop
        string or the Completed event; RouterError becomes ApiError."""
        try:
            async for event in run.stream():
                if isinstance(event, TokenOut):
                    progress.tokens += 1
                    if self.job.logprobs is not None:
                        progress.logprobs.append(self.job.logprobs.entry(event.token_id, event.logprobs,
                                                                         progress.offset))
                        progress.offset += len(event.text)
                    if progress.ttft_ms is None:
                        progress.ttft_ms = event.time_since_start_ms
                    yield stop.feed(event.text)
                    if stop.stopped:
                        return
                elif isinstance(event, Started):
                    progress.route = event.route.name.lower()
                elif isinstance(event, Completed):
                    progress.completed = event
                    progress.route = event.route.name.lower()
            # The pieces' held-back end (Completed.text_tail): whole and streamed answers end alike.
            yield stop.feed(progress.completed.text_tail if progress.completed is not None else "")
            if not stop.stopped:
                yield stop.flush()
        except RouterError as exc:
            raise from_router(exc) from None

    def _headers(self, progress: Progress, content_type: bytes) -> list[tuple[bytes, bytes]]:
        h = [(b"content-type", content_type), (b"x-request-id", self.job.params.request_id.encode()),
             (b"x-pdserve-route", progress.route.encode())]
        if progress.ttft_ms is not None:
            h.append((b"x-pdserve-ttft-ms", f"{progress.ttft_ms:.3f}".encode()))
        done = progress.completed
        if done is not None:
            h += [(b"x-pdserve-tpot-ms", f"{done.tpot_ms:.3f}".encode()),
                  (b"x-pdserve-attempts", str(done.attempts).encode())]
        return h

    async def _chunk(self, send, progress: Progress, text: str) -> None:
        first = not self._sent_start
        if first:
            await send({"type": "http.response.start", "status": 200, "headers": self._headers(
                progress, b"text/event-stream") + [(b"cache-control", b"no-cache")]})
            self._sent_start = True
            text = self.job.echo + text
        if text or first or progress.logprobs:
            await send({"type": "http.response.body", "more_body": True, "body": self.job.shape.chunk(
                text, first=first, logprobs=progress.take_logprobs(self.job.logprobs))})

    async def _end(self, send, progress: Progress, finish: str) -> None:
        shape, prompt_tokens = self.job.shape, len(self.job.params.prompt_token_ids)
        if not self.job.stream:
            body = shape.whole(self.job.echo + "".join(progress.text), finish, prompt_tokens, progress.tokens,
                               progress.take_logprobs(self.job.logprobs))
            await send({"type": "http.response.start", "status": 200,
                        "headers": self._headers(progress, b"application/json")})
            await send({"type": "http.response.body", "body": body})
            return
        if not self._sent_start:
            await self._chunk(send, progress, "")
        tail = shape.chunk("", finish, logprobs=progress.take_logprobs(self.job.logprobs))
        if shape.include_usage:
            tail += shape.usage_chunk(prompt_tokens, progress.tokens)
        await send({"type": "http.response.body", "body": tail + DONE})

    async def _error(self, send, err: ApiError) -> None:
        if self._gone:
            return
        if not self._sent_start:
            headers = [(b"content-type", b"application/json"),
                       (b"x-request-id", self.job.params.request_id.encode())]
            headers += [(k.encode(), v.encode()) for k, v in err.headers().items()]
            await send({"type": "http.response.start", "status": err.status, "headers": headers})
            await send({"type": "http.response.body", "body": err.body()})
            return
        await send({"type": "http.response.body", "body": sse(err.payload()) + DONE})
