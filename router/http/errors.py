"""Errors as OpenAI's API gives them: a status and `{"error": {message, type, param, code}}`.

The router's refusals carry a gRPC-style StatusCode (router/types.py); `from_router` gives
each the HTTP status a client of OpenAI's API expects for that cause, so a retrying
client can tell "fix the request" (4xx) from "try again" (429, 503) and "too late" (504).
Messages are bounded like the gRPC front's (router/edge/refusal.py `bounded`).
"""

from __future__ import annotations

import dataclasses

import orjson

from router.edge.refusal import bounded
from router.types import RouterError, StatusCode

_BY_CODE = {
    StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error"),
    StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    StatusCode.NOT_FOUND: (404, "not_found_error"),
    StatusCode.ALREADY_EXISTS: (409, "conflict_error"),
    StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    StatusCode.CANCELLED: (499, "cancelled"),
    StatusCode.UNAVAILABLE: (503, "service_unavailable"),
    StatusCode.ABORTED: (503, "service_unavailable"),
    StatusCode.DEADLINE_EXCEEDED: (504, "timeout"),
    StatusCode.UNIMPLEMENTED: (501, "not_implemented"),
}
"""RouterError status -> (HTTP status, OpenAI error type); anything else is a 500."""

RETRY_AFTER_S = 1
"""Retry-After of a 429 or 503: the admission queue and the cluster view move within
about a second (router/requests/queueing.py polls every 50 ms; leases are seconds)."""


@dataclasses.dataclass(eq=False)
class ApiError(Exception):
    """A request refused with `status`; `param` names the offending field when one is."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def payload(self) -> dict:
        """The object OpenAI's clients parse (`openai.APIStatusError.body`); a stream's `error` event carries it too."""
        return {"error": {"message": bounded(self.message), "type": self.type, "param": self.param,
                          "code": self.code or str(self.status)}}

    def body(self) -> bytes:
        """`payload` as a response body."""
        return orjson.dumps(self.payload())

    def headers(self) -> dict[str, str]:
        """Retry-After on the statuses a client should retry."""
        return {"retry-after": str(RETRY_AFTER_S)} if self.status in (429, 503) else {}


def from_router(exc: RouterError) -> ApiError:
    """The HTTP error of a router refusal or a request's failure."""
    status, kind = _BY_CODE.get(exc.code, (500, "internal_error"))
    return ApiError(status, exc.message, kind, code=exc.code.name.lower())


def bad_request(message: str, param: str | None = None) -> ApiError:
    """400 naming the field (`param`) that was wrong."""
    return ApiError(400, message, "invalid_request_error", param)
