"""Freezing the deployment manifest (docs/design.md, The release) from what is live: the workers the
directory lists, the router's tokenizer and modes; and where what is live has drifted
from a frozen one (another model, tokenizer, cache ABI or transports: a deployment the
manifest was not frozen for)."""

from __future__ import annotations

import collections
import hashlib
from typing import Any

from runtime.directory.records import ClusterSnapshot
from runtime.release.record import DeploymentManifest

ALLOWED_MODES = ("colocated", "disaggregated", "auto", "shadow", "canary")
FALLBACK_MODE = "colocated"
IDENTITY_FIELDS = ("model", "model_identity", "tokenizer_identity", "cache_abi_digests", "transports")
"""What makes a deployment the manifest's: roles and the route epoch change under it
(scaling, a rollback); these only with another deployment."""
SHOWN_CHARS = 12
"""Digests are shown this long (as `pdctl release status` shows the cache ABI)."""


def tokenizer_identity(tokenizer: Any | None) -> str:
    """sha256 of the tokenizer's serialized form (a `tokenizers.Tokenizer`), or "none"
    for a router that takes token ids only."""
    if tokenizer is None:
        return "none"
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()


def freeze(cluster: ClusterSnapshot, ctl) -> DeploymentManifest:
    """The manifest of what `cluster` runs now, under router `ctl`'s model and tokenizer."""
    roles = collections.Counter(w.role.value for w in cluster.workers)
    return DeploymentManifest(
        model=ctl.config.model,
        model_identity=tuple(sorted({w.model_identity for w in cluster.workers if w.model_identity})),
        tokenizer_identity=ctl.tokenizer_identity,
        cache_abi_digests=tuple(sorted({w.cache_abi_digest for w in cluster.workers})),
        transports=tuple(sorted({w.data_plane_address.partition("://")[0] for w in cluster.workers
                                 if "://" in w.data_plane_address})),
        roles=tuple(f"{role}={n}" for role, n in sorted(roles.items())),
        route_epoch=cluster.route_epoch,
        allowed_modes=ALLOWED_MODES,
        fallback_mode=FALLBACK_MODE)


def drift(frozen: DeploymentManifest, live: DeploymentManifest) -> list[str]:
    """Each identity field where `live` is not `frozen`, as "field frozen -> live"
    (digests shortened)."""
    return [f"{name} {_shown(name, getattr(frozen, name))} -> {_shown(name, getattr(live, name))}"
            for name in IDENTITY_FIELDS if getattr(frozen, name) != getattr(live, name)]


def _shown(name: str, value: str | tuple[str, ...]) -> str:
    values = (value,) if isinstance(value, str) else value
    digests = name != "model" and name != "transports"
    return ",".join(v[:SHOWN_CHARS] if digests else v for v in values) or "-"
