"""Who called the router: the tenant a call acts for and the name the audit log gives it.

With security on, a client's certificate names its tenant (runtime/security/pki.py): it
generates, lists and cancels as that tenant only, whatever its request says. An
operator's certificate acts for every tenant.
"""

from __future__ import annotations

from runtime.security.tls import caller


def caller_tenant(context, secure: bool) -> str | None:
    """The tenant a call acts for: a client certificate's name; None for an operator
    (every tenant) or when insecure (the request's own field decides)."""
    if not secure:
        return None
    who = caller(context)
    return None if who is None or who.role != "client" else who.name

