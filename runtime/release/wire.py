"""Release records <-> pd.v1 protos (proto/pd/v1/release.proto). The directory stores
the record as the proto's deterministic serialization."""

from __future__ import annotations

from pdserve_client.rpc.pd.v1 import release_pb2
from runtime.release.machine import Release, RollbackStep
from runtime.release.record import DeploymentManifest, ReleaseRecord, Rollback, StepRecord, Transition

_MANIFEST_LISTS = ("model_identity", "cache_abi_digests", "transports", "roles", "allowed_modes")


class BadRelease(ValueError):
    """A release record that cannot be one (unknown state or step, a manifest whose digest
    does not match its fields)."""


def _state(value: int, field: str) -> Release:
    try:
        return Release(value)
    except ValueError:
        raise BadRelease(f"{field}: {value} is not a release state") from None


def manifest_to_pb(m: DeploymentManifest) -> release_pb2.DeploymentManifest:
    return release_pb2.DeploymentManifest(
        model=m.model, tokenizer_identity=m.tokenizer_identity, route_epoch=m.route_epoch,
        fallback_mode=m.fallback_mode, digest=m.digest, **{f: list(getattr(m, f)) for f in _MANIFEST_LISTS})


def manifest_from_pb(pb: release_pb2.DeploymentManifest) -> DeploymentManifest:
    m = DeploymentManifest(model=pb.model, tokenizer_identity=pb.tokenizer_identity, route_epoch=pb.route_epoch,
                           fallback_mode=pb.fallback_mode, **{f: tuple(getattr(pb, f)) for f in _MANIFEST_LISTS})
    if pb.digest and pb.digest != m.digest:
        raise BadRelease(f"manifest digest {pb.digest[:16]}... does not match its fields ({m.digest[:16]}...)")
    return m


def step_to_pb(s: StepRecord) -> release_pb2.RollbackStepRecord:
    return release_pb2.RollbackStepRecord(step=int(s.step), started_unix_ms=s.started_ms, ended_unix_ms=s.ended_ms,
                                          counts=dict(s.counts), detail=s.detail)


def step_from_pb(pb: release_pb2.RollbackStepRecord) -> StepRecord:
    try:
        step = RollbackStep(pb.step)
    except ValueError:
        raise BadRelease(f"rollback step {pb.step} is not one") from None
    return StepRecord(step, pb.started_unix_ms, pb.ended_unix_ms, dict(pb.counts), pb.detail)


def record_to_pb(r: ReleaseRecord) -> release_pb2.ReleaseRecord:
    pb = release_pb2.ReleaseRecord(mode=int(r.state), version=r.version, canary_fraction=r.canary_fraction,
                                   history=[release_pb2.ReleaseTransition(
                                       from_mode=int(t.from_state), to_mode=int(t.to_state), at_unix_ms=t.at_ms,
                                       by=t.by, reason=t.reason, gates=t.gates) for t in r.history])
    if r.manifest is not None:
        pb.manifest.CopyFrom(manifest_to_pb(r.manifest))
    if r.rollback is not None:
        rb = r.rollback
        pb.rollback.CopyFrom(release_pb2.RollbackRecord(
            from_mode=int(rb.from_state), started_unix_ms=rb.started_ms, reason=rb.reason, by=rb.by,
            steps=[step_to_pb(s) for s in rb.steps], retired_epoch=rb.retired_epoch, owner=rb.owner,
            owner_until_unix_ms=rb.owner_until_ms))
    return pb


def record_from_pb(pb: release_pb2.ReleaseRecord) -> ReleaseRecord:
    """The record a proto carries; BadRelease when it cannot be one."""
    rollback = None
    if pb.HasField("rollback"):
        rb = pb.rollback
        rollback = Rollback(_state(rb.from_mode, "rollback.from_mode"), rb.started_unix_ms, rb.reason, rb.by,
                            tuple(step_from_pb(s) for s in rb.steps), rb.retired_epoch, rb.owner,
                            rb.owner_until_unix_ms)
    history = tuple(Transition(_state(t.from_mode, "history.from_mode"), _state(t.to_mode, "history.to_mode"),
                               t.at_unix_ms, t.by, t.reason, t.gates) for t in pb.history)
    if not 0.0 <= pb.canary_fraction <= 1.0:
        raise BadRelease(f"canary_fraction {pb.canary_fraction} is not in [0, 1]")
    return ReleaseRecord(_state(pb.mode, "mode"), pb.version,
                         manifest_from_pb(pb.manifest) if pb.HasField("manifest") else None,
                         pb.canary_fraction, history, rollback)


def encode(r: ReleaseRecord) -> bytes:
    """The stored form: the proto's deterministic serialization."""
    return record_to_pb(r).SerializeToString(deterministic=True)


def decode(blob: bytes) -> ReleaseRecord:
    """Inverse of `encode`; BadRelease on bytes that are no record."""
    pb = release_pb2.ReleaseRecord()
    try:
        pb.ParseFromString(blob)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise BadRelease(f"stored release record does not parse: {exc}") from None
    return record_from_pb(pb)
