"""A Kubernetes pod's own certificate, issued at pod start by an init container.

    python -m runtime.security.podcert --ca-dir /pd/ca --out /pd/tls \\
        --role decode --name "$POD_NAME" [--host "$POD_IP"] [--days 30]

Why an init container: a worker's certificate must name its worker id (``decode/<id>``,
runtime/security/pki.py) and in a Deployment the id is the pod's name, known only
once the pod exists; cert-manager cannot issue per pod of a Deployment. The Helm chart
(helm/pdserve) mounts the CA Secret (``tls.crt``, ``tls.key``) into this init container
only, never into the serving container, which gets the three files written here through
a memory-backed emptyDir:

    <out>/tls.crt   the pod's certificate (CN <role>/<name>, URI SAN pdserve://<role>/<name>,
                    and for a server role the DNS names <service>.pdserve.internal)
    <out>/tls.key   its private key (mode 0600)
    <out>/ca.crt    the CA every peer must chain to

The trade-off (docs/deploy.md): whoever can create pods that mount the CA Secret can
mint any identity; the namespace is the trust boundary, as it is for the Secrets
themselves.
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import sys
from pathlib import Path

from pdserve_client import contract

from .pki import Identity, LocalCA

CERT_FILE, KEY_FILE = "tls.crt", "tls.key"
"""File names in the CA folder and in the output folder (a kubernetes.io/tls Secret's keys)."""


def issue(ca_dir: Path, out: Path, identity: Identity, hosts: tuple[str, ...] = (),
          validity: datetime.timedelta = datetime.timedelta(days=30)) -> Path:
    """Write `out`/tls.crt, tls.key and ca.crt for `identity`, signed by the CA in `ca_dir`;
    returns the certificate's path."""
    ca = LocalCA.from_files(ca_dir / CERT_FILE, ca_dir / KEY_FILE)
    out.mkdir(parents=True, exist_ok=True)
    crt = ca.issue(identity, "tls", hosts=hosts, out_dir=out, validity=validity)
    (out / "tls.crt").chmod(0o644)
    shutil.copyfile(ca_dir / CERT_FILE, out / contract.TLS_CA_FILE)
    return crt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime.security.podcert", description=__doc__.split("\n")[0])
    ap.add_argument("--ca-dir", required=True, type=Path, help="folder with the CA's tls.crt and tls.key")
    ap.add_argument("--out", required=True, type=Path, help="folder to write tls.crt, tls.key, ca.crt into")
    ap.add_argument("--role", required=True, choices=contract.ROLES)
    ap.add_argument("--name", required=True, help="worker id (the pod name), tenant or service name")
    ap.add_argument("--host", action="append", default=[], help="extra SAN (IP or DNS name); repeatable")
    ap.add_argument("--days", type=float, default=30.0, help="validity in days (default 30)")
    args = ap.parse_args(argv)
    if args.days <= 0:
        ap.error("--days must be positive")
    try:
        identity = Identity(args.role, args.name)
        crt = issue(args.ca_dir, args.out, identity, tuple(h for h in args.host if h),
                    datetime.timedelta(days=args.days))
    except (OSError, ValueError) as e:
        print(f"podcert: {e}", file=sys.stderr)
        return 1
    print(f"podcert: issued {identity} -> {crt}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
