"""The two processes of bench/security.py's bandwidth part: bench/_transfer_peers.py's
Peer with each data plane's security as the workers deploy it (runtime/worker/process.py).

A *variant* names one receiver (R) or sender (S) of a backend, with or without security:

  tls   the TCP stream under mutual TLS (R holds decode-0's certificate, S prefill-0's);
        UCX never has TLS: its bytes must not be copied through it
  cap   S presents a signed capability (AUTH) before the first chunk; R checks it with
        the worker's own DestinationGate (Verifier on the public key set, the sender's
        certificate name against the capability's source when TLS names it) and a
        stand-in for the directory's ConsumeNonce that accepts each nonce once, at once

The parent makes the certificates and keys (one CA per run) and passes their folder.
S mints the capability outside the timed window (the router's work); the timed window
runs from AUTH to the verdict, so R's check is inside it.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

from _transfer_peers import Peer

from pdserve_client.tls import TlsFiles
from runtime.security.capability import PUSH, Grant, Signer, Verifier
from runtime.security.tls import Security
from runtime.transfer.factory import make_receiver, make_sender
from runtime.worker.capabilities import DestinationGate

ISSUER, TENANT, ABI = "router", "bench", "bench-abi"
SOURCE, DESTINATION = "prefill-0", "decode-0"
TTL_MS = 60_000
SIGNING_KEY, PUBLIC_KEYS = "capability-signing.pem", "capability-keys.json"


class SecurePeer(Peer):
    """Peer plus `sec_*` commands keyed by variant (the Peer's tables hold them by that name)."""

    def __init__(self, tls_dir: str, threads: int = 1):
        super().__init__(threads)
        self.tls_dir = Path(tls_dir)
        self.gates: dict[str, DestinationGate] = {}
        self.nonces: set[str] = set()

    def _security(self, name: str) -> Security:
        return Security.of(TlsFiles.in_dir(self.tls_dir, name))

    async def _consume(self, nonce: str, expires_unix_ms: int, transfer_id: str, route_epoch: int,
                       capability: bytes = b"") -> bool:
        fresh = nonce not in self.nonces
        self.nonces.add(nonce)
        return fresh

    # ---- receiver ---------------------------------------------------------------
    async def sec_listen(self, variant: str, kind: str, tls: bool, cap: bool) -> str:
        opts = {"ssl_context": self._security(DESTINATION).server_ssl()} if tls else {}
        receiver = self.receivers[variant] = make_receiver(kind, host="127.0.0.1", name=f"bench-{variant}",
                                                           **opts)
        await receiver.start()
        if cap:
            verifier = Verifier.from_file(self.tls_dir / PUBLIC_KEYS, [ISSUER], TTL_MS)
            self.gates[variant] = DestinationGate(verifier, DESTINATION, lambda: 1, ABI, self._consume)
        return receiver.address

    async def sec_expect(self, variant: str, transfer_id: str, key: str = "") -> None:
        """Peer.pd_expect (keyed by `key`, hex), with the capability check on the expectation
        when `cap`."""
        await self.pd_expect(variant, transfer_id, key)
        gate = self.gates.get(variant)
        if gate is None:
            return
        regions, nbytes = tuple(range(self.geometry.blocks)), self.geometry.nbytes

        async def authorize(credential: dict, peer: str | None) -> None:
            await gate.check(credential, peer, tenant=TENANT, transfer_id=transfer_id, generation=1,
                             regions=regions, num_bytes=nbytes)
        self.receivers[variant].pending[transfer_id].authorize = authorize

    # ---- sender -----------------------------------------------------------------
    async def sec_connect(self, variant: str, kind: str, tls: bool) -> None:
        opts = {"ssl_context": self._security(SOURCE).client_ssl()} if tls else {}
        self.senders[variant] = make_sender(kind, **opts)
        await self.senders[variant].start()

    def _credential(self, transfer_id: str) -> dict:
        """What the prefill worker presents: the router's capability, its name, the nonce."""
        g = self.geometry
        minted = Signer.from_file(self.tls_dir / SIGNING_KEY, ISSUER).mint(Grant(
            TENANT, SOURCE, 1, DESTINATION, 1, transfer_id, 1, 0, ABI, PUSH, tuple(range(g.blocks)),
            g.nbytes, TTL_MS))
        return {"capability": base64.b64encode(minted.raw).decode(), "source_worker_id": SOURCE,
                "source_epoch": 1, "nonce": minted.nonce.hex()}

    async def sec_send(self, variant: str, dest: str, transfer_id: str, kv_digest: str, cap: bool,
                       key: str = "") -> dict:
        """Peer.pd_send with its AUTH (the capability when `cap`); timed from AUTH to the verdict."""
        credential = self._credential(transfer_id) if cap else None
        t0 = time.perf_counter()
        out = await self.pd_send(variant, dest, transfer_id, kv_digest, key, credential)
        out["elapsed_s"] = time.perf_counter() - t0
        return out
