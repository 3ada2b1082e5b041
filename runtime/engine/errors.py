"""Engine errors: every rejection says what was wrong, with the numbers.

Callers (the gRPC servicers) map these to status codes: `InvalidRequest` to
INVALID_ARGUMENT, `OutOfBlocks` to RESOURCE_EXHAUSTED, `AbiMismatch` to
FAILED_PRECONDITION.
"""


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequest(EngineError, ValueError):
    """The request itself is malformed (empty prompt, token out of vocab, ...)."""


class OutOfBlocks(EngineError):
    """The block pool cannot hold what was asked; nothing was allocated."""

    def __init__(self, needed_blocks: int, free_blocks: int, total_blocks: int):
        self.needed_blocks = needed_blocks
        self.free_blocks = free_blocks
        self.total_blocks = total_blocks
        super().__init__(
            f"need {needed_blocks} K/V blocks, {free_blocks} free of {total_blocks}"
        )


class AbiMismatch(EngineError):
    """Two caches disagree on layout, shape, dtype or model identity."""


class CheckpointError(EngineError):
    """A checkpoint directory is missing files or describes an unsupported model."""
