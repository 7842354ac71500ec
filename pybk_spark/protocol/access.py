"""Who may do what on a bookie: the role of a peer and the check of one request.  Pure.

Theory of operation
-------------------
A bookie serving TLS knows each peer by its client certificate: the
identities of a peer are its subject common name and every subject
alternative name (DNS names, IP addresses, URIs), as the transport reports
them (bookie_server/serving/tls.py).  A peer without a certificate (client
certificates ``optional`` or ``none``) has no identity.

Roles, from the bookie's configuration:

* **operator**: an identity listed in ``tls_operator_identities``.  May do
  everything a writer may, and more: recovery adds, fencing and fencing
  reads of ANY ledger without its master key (the request carries the empty
  key, :data:`OPERATOR_KEY`).  Re-replication, auto-recovery and the admin
  tools run as operators and so work on ledgers whose passwords they do not
  know.
* **writer** (writers and readers alike): an identity listed in
  ``tls_writer_identities``; when that list is empty, any peer the TLS layer
  let in (with ``tls_client_auth = required``: any client whose certificate
  the bookie's CA verified).  The ledger's master key still applies, as in
  BookKeeper: the key check of pybk_spark/protocol/ledger_state.py is unchanged.
* anyone else: every request is refused with ``Unauthorized``, naming the
  identity and the settings that would admit it.

With TLS the empty key belongs to operators: an add, fence or explicit LAC
carrying it from anyone else is refused (a writer always sends its
ledger's key; without this, the first empty-keyed request would set the key
of a ledger a bookie does not know yet, such as a replacement bookie's).

Asking a bookie to pull a ledger's entries from a peer (``pull``: bookie-to-
bookie re-replication, wire ``PullEntries``) is an operator's request only
(:data:`OPERATOR_OPS`): a writer could otherwise make a bookie copy and
journal data it never wrote.

A bookie without TLS has no identities: every peer is a writer and nobody
is an operator (an empty key is then just a wrong key); ``pull`` is then
open, like the admin tools' other requests on a plaintext cluster.

An operator may also learn a ledger's master key: a non-fencing LAC read
with the empty key from an operator is answered with the key the bookie
recorded (:func:`may_learn_key`).  Re-replication uses it to write its
copies under the writer's key (so the new replica checks the key like the
others) and to verify keyed (hmac) digests; it checks the key it learned
against the ledger metadata's ``password_check`` first.

The admin HTTP API (bookie_server/serving/admin_http.py) asks :func:`admin_refusal`
the same question of the same roles: when the bookie's HTTP port speaks TLS
and asks for client certificates, a route that changes the bookie or the
cluster (every ``PUT``: read-only switch, GC trigger, autorecovery switch,
audit trigger, lost-bookie delay) needs the operator role, and a route that
only reads needs an authenticated identity with a role (writer or
operator), as BookKeeper's HTTP server puts every route behind its
authentication provider.  No certificate: ``unauthenticated`` (HTTP 401);
an identity without the role: ``forbidden`` (403); each names what is
missing.

``check`` returns whether the request uses the operator's key-less path;
the bookie then skips the master-key check for it and records no key (a
ledger known to a bookie only through operator copies gets its key from
the first keyed request, as a new ledger does).
"""
from __future__ import annotations

from dataclasses import dataclass

from pybk_spark import errors

OPERATOR_KEY = b""          # the master key an operator sends instead of the ledger's

OPERATOR, WRITER = "operator", "writer"
# operations the key-less path covers (BookKeeper's recovery reads/adds and fencing)
KEYLESS_OPS = frozenset({"recovery_add", "fence"})
OPS = frozenset({"add", "recovery_add", "fence", "read", "write_lac", "info", "pull"})
OPERATOR_OPS = frozenset({"pull"})      # operators only (with TLS)
KEYED_OPS = frozenset({"add", "recovery_add", "fence", "write_lac"})   # carry the ledger's key


@dataclass(frozen=True)
class Policy:
    tls: bool = False
    writers: frozenset[str] = frozenset()       # empty: any peer TLS admitted
    operators: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Peer:
    identities: frozenset[str] = frozenset()    # CN + SANs of a verified client certificate

    def describe(self) -> str:
        return ", ".join(sorted(self.identities)) or "none (no client certificate)"


ANONYMOUS = Peer()


def parse_identities(text: str) -> frozenset[str]:
    """``a, b ,c`` -> {"a", "b", "c"} (the config's comma-separated lists)."""
    return frozenset(p.strip() for p in (text or "").split(",") if p.strip())


def role_of(policy: Policy, peer: Peer) -> str | None:
    if not policy.tls:
        return WRITER
    if peer.identities & policy.operators:
        return OPERATOR
    if not policy.writers or peer.identities & policy.writers:
        return WRITER
    return None


def check(policy: Policy, peer: Peer, op: str, key: bytes = b"x") -> bool:
    """Raise ``Unauthorized`` if ``peer`` may not do ``op``; True when the
    request takes the operator's key-less path (``key`` is the empty key on
    a key-less operation from an operator)."""
    if op not in OPS:
        raise errors.BadRequest(f"unknown operation {op!r}")
    if not policy.tls:
        return False
    role = role_of(policy, peer)
    if role is None:
        raise errors.Unauthorized(
            f"client identity {peer.describe()} may not {op} on this bookie: list it in "
            "tls_writer_identities (or tls_operator_identities) in the bookie's conf")
    if op in OPERATOR_OPS and role != OPERATOR:
        raise errors.Unauthorized(
            f"only an operator may {op}: client identity {peer.describe()} is not in "
            "tls_operator_identities")
    if bytes(key) == OPERATOR_KEY and op in KEYED_OPS:
        if role == OPERATOR and op in KEYLESS_OPS:
            return True
        raise errors.Unauthorized(
            f"the empty master key is the operator's (recovery adds and fencing only): "
            f"client identity {peer.describe()} is not in tls_operator_identities")
    return False


def may_learn_key(policy: Policy, peer: Peer, key: bytes, fence: bool) -> bool:
    """A LAC read answered with the ledger's recorded master key."""
    return (policy.tls and not fence and bytes(key) == OPERATOR_KEY
            and role_of(policy, peer) == OPERATOR)


@dataclass(frozen=True)
class Refusal:
    reason: str             # "unauthenticated" (no identity) | "forbidden" (not the role)
    missing: str            # what would admit the request: "client certificate" | a role
    message: str


def admin_refusal(policy: Policy, peer: Peer, mutating: bool) -> Refusal | None:
    """Why ``peer`` may not use an admin route (None: it may).  Only for a
    bookie whose HTTP port authenticates clients (TLS with client certificates)."""
    what = "change the bookie through the admin API" if mutating else "read the admin API"
    if not peer.identities:
        return Refusal("unauthenticated", "client certificate",
                       f"a client certificate signed by the bookie's tls_ca_file is needed to "
                       f"{what}" + (" (with an identity in tls_operator_identities)"
                                    if mutating else ""))
    role = role_of(policy, peer)
    if mutating and role != OPERATOR:
        return Refusal("forbidden", OPERATOR,
                       f"client identity {peer.describe()} may not {what}: the operator role is "
                       "needed (list it in tls_operator_identities)")
    if role is None:
        return Refusal("forbidden", WRITER,
                       f"client identity {peer.describe()} may not {what}: list it in "
                       "tls_writer_identities or tls_operator_identities")
    return None
