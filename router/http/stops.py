"""Stop strings, matched on the detokenized text as it streams.

A stop string may end in a later token than it starts in, so the last
(longest stop - 1) characters are held back until the next piece shows they do not
begin one; the text before a match is released, the match itself never is (OpenAI's
contract). Held text is released when generation ends without a match.
"""

from __future__ import annotations


class StopText:
    """Feeds text pieces, releases the text a client may see, says when a stop matched."""

    __slots__ = ("_stops", "_hold", "_buffer", "stopped")

    def __init__(self, stops: tuple[str, ...]):
        self._stops = stops
        self._hold = max(map(len, stops), default=1) - 1
        self._buffer = ""
        self.stopped: str | None = None
        """The stop string that matched (None: none yet)."""

    def feed(self, piece: str) -> str:
        """Add `piece`; returns the text now safe to release. Once a stop matched
        (`stopped`), the text up to it was the last released."""
        if not self._stops:
            return piece
        buf = self._buffer + piece
        hit = min(((i, s) for s in self._stops if (i := buf.find(s)) >= 0), default=None)
        if hit is not None:
            self._buffer, self.stopped = "", hit[1]
            return buf[:hit[0]]
        cut = max(0, len(buf) - self._hold)
        self._buffer = buf[cut:]
        return buf[:cut]

    def flush(self) -> str:
        """The held text, at the end of generation without a match."""
        out, self._buffer = self._buffer, ""
        return out
