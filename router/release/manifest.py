"""Freezing the deployment manifest (article 0x0FF) from what is live: the workers the
directory lists, the router's tokenizer and modes."""

from __future__ import annotations

import collections
import hashlib
from typing import Any

from router.types import Cluster
from services.release.record import DeploymentManifest

ALLOWED_MODES = ("colocated", "disaggregated", "auto", "shadow", "canary")
FALLBACK_MODE = "colocated"


def tokenizer_identity(tokenizer: Any | None) -> str:
    """sha256 of the tokenizer's serialized form (a `tokenizers.Tokenizer`), or "none"
    for a router that takes token ids only."""
    if tokenizer is None:
        return "none"
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()


def freeze(cluster: Cluster, ctl) -> DeploymentManifest:
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
