"""The least-privilege etcd role layout, and ``pybk etcd-roles`` applying it.

Theory of operation:
  * etcd RBAC grants READ / WRITE / READWRITE on a key or a key prefix to a
    role; users get roles.  Keys here are relative to the metadata scope
    (``/<scope>/``; the store adds the prefix), so one etcd can hold several
    scopes with separate roles (name roles per scope, e.g. ``--role-prefix``).
  * The layout (docs/operations.md, "Securing etcd"):
      pybk-operator   READWRITE on the whole scope (pybk admin commands, the
                      auditor / autorecovery, recovery and re-replication jobs)
      pybk-bookie     READ on the scope (GC reads ledgers/, the start-up guards
                      read bookies/ and cookies/); READWRITE on bookies/
                      (writable/, readonly/, damaged/, instances/) and cookies/
      pybk-client     READ on the scope; READWRITE on ledgers/, idgen, writers/,
                      logs/, logchunks/ and spark/ (what writers, readers and
                      Spark change)
    Reads are scope-wide: metadata is not confidential (entry data is guarded
    by ledger passwords); what RBAC prevents is a bookie or client rewriting
    metadata it has no business changing.
  * Per-bookie roles (``bookie_role(id)``): READWRITE on exactly
    bookies/writable/<id>, bookies/readonly/<id>, bookies/damaged/<id>,
    bookies/instances/<id> and cookies/<id>.  A stolen bookie credential can then only forge its own
    registration, at the cost of one etcd user and role per bookie.  The
    shared pybk-bookie role is simpler to run, and lets one bookie overwrite
    another's registration or cookie (never ledger metadata).
  * ``apply`` is idempotent: it adds missing roles and users, (re)grants the
    permissions and user roles, optionally resets passwords, and enables
    auth last (after creating the ``root`` user etcd requires).  After
    ``enable`` the store it used (unauthenticated) is refused; reconnect as
    root or an operator.
  * The etcd Auth API itself is reached through
    ``EtcdMetadataStore.auth_request`` (etcd_store.py, the one pyetcd module).
"""
from __future__ import annotations

import argparse

from typing import Iterable, Mapping

from pybk_spark import errors
from pybk_spark.admin.commands import shell_common
from pybk_spark.metadata import keys
from pybk_spark.metadata.etcd_store import EtcdMetadataStore
from pybk_spark.metadata.security import EtcdSecurity
from pybk_spark.metadata.store import MetadataStore

OPERATOR, BOOKIE, CLIENT = "pybk-operator", "pybk-bookie", "pybk-client"
PREFIX = True

# role -> grants (permission, key relative to the scope, key is a prefix)
LAYOUT: dict[str, list[tuple[str, str, bool]]] = {
    OPERATOR: [("READWRITE", "", PREFIX)],
    BOOKIE: [("READ", "", PREFIX),
             ("READWRITE", keys.BOOKIES_PREFIX, PREFIX),
             ("READWRITE", keys.COOKIES_PREFIX, PREFIX)],
    CLIENT: [("READ", "", PREFIX),
             ("READWRITE", keys.LEDGERS_PREFIX, PREFIX),
             ("READWRITE", "idgen", False),
             ("READWRITE", keys.WRITERS_PREFIX, PREFIX),
             ("READWRITE", keys.LOGS_PREFIX, PREFIX),
             ("READWRITE", keys.LOG_CHUNKS_PREFIX, PREFIX),
             ("READWRITE", "spark/", PREFIX)],
}


def bookie_role(bookie_id: str) -> tuple[str, list[tuple[str, str, bool]]]:
    """One bookie's own role: its registration, damage marker and cookie keys only."""
    if not bookie_id or "/" in bookie_id:
        raise errors.IncorrectParameter(f"bad bookie id {bookie_id!r}")
    return f"{BOOKIE}-{bookie_id}", [
        ("READ", "", PREFIX),
        ("READWRITE", keys.bookie_key("writable", bookie_id), False),
        ("READWRITE", keys.bookie_key("readonly", bookie_id), False),
        ("READWRITE", keys.bookie_key("damaged", bookie_id), False),
        ("READWRITE", keys.bookie_key("instances", bookie_id), False),
        ("READWRITE", keys.cookie_key(bookie_id), False)]


def layout(bookie_ids: Iterable[str] = ()) -> dict[str, list[tuple[str, str, bool]]]:
    out = dict(LAYOUT)
    for bid in bookie_ids:
        name, grants = bookie_role(bid)
        out[name] = grants
    return out


def apply(store: MetadataStore, *, roles: Mapping[str, list[tuple[str, str, bool]]],
          users: Mapping[str, tuple[str, str | None]] = {}, root_password: str | None = None,
          enable: bool = False) -> dict:
    """Create/grant ``roles``; ``users`` maps user -> (role, password or None
    to keep an existing user's password); ``root_password`` creates the
    ``root`` user when missing; ``enable`` turns etcd auth on, last.
    Returns what was done; ``IncorrectParameter`` for a store that is not
    etcd."""
    if not isinstance(store, EtcdMetadataStore):
        raise errors.IncorrectParameter("etcd-roles needs an etcd:// metadata URI")
    done: dict[str, list[str]] = {"roles": [], "users": [], "enabled": []}
    existing_roles = set(store.auth_request("RoleList").roles)
    existing_users = set(store.auth_request("UserList").users)
    if enable and "root" not in existing_users:
        if not root_password:
            raise errors.IncorrectParameter(
                "etcd needs a root user before auth is enabled: pass --root-password-file")
        users = {**users, "root": ("root", root_password)}
    for role, grants in roles.items():
        if role not in existing_roles:
            store.auth_request("RoleAdd", name=role)
            existing_roles.add(role)
            done["roles"].append(role)
        for grant in grants:
            store.auth_request("RoleGrantPermission", name=role, perm=grant)
    for user, (role, password) in users.items():
        if role not in existing_roles:
            if role != "root":
                raise errors.IncorrectParameter(f"user {user!r}: unknown role {role!r}")
            store.auth_request("RoleAdd", name="root")
            existing_roles.add("root")
        if user not in existing_users:
            if not password:
                raise errors.IncorrectParameter(f"user {user!r} does not exist: give a password")
            store.auth_request("UserAdd", name=user, password=password)
            done["users"].append(user)
        elif password:
            store.auth_request("UserChangePassword", name=user, password=password)
        if role not in store.auth_request("UserGet", name=user).roles:
            store.auth_request("UserGrantRole", user=user, role=role)
    if enable:
        store.auth_request("AuthEnable")
        done["enabled"].append("auth")
    return done


# -- pybk etcd-roles -----------------------------------------------------------------------
def _read_password(path: str, what: str) -> str:
    return EtcdSecurity(etcd_user=what, etcd_password_file=path).password()


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--apply", action="store_true",
                   help="create the roles (and users) in etcd; without it, print the layout")
    p.add_argument("--per-bookie", action="append", default=[], metavar="BOOKIE_ID",
                   help="also a role pybk-bookie-<id> limited to that bookie's own keys")
    p.add_argument("--user", action="append", nargs=3, default=[],
                   metavar=("NAME", "ROLE", "PASSWORD_FILE"),
                   help="create/update a user with this role and the password in the file")
    p.add_argument("--enable-auth", action="store_true",
                   help="enable etcd authentication once roles and users exist")
    p.add_argument("--root-password-file",
                   help="password of the root user to create before enabling auth")


def _run(args: argparse.Namespace) -> int:
    roles = layout(args.per_bookie)
    rows = [{"role": r, "permission": perm, "key": f"/<scope>/{key}" + ("*" if pre else "")}
            for r, grants in roles.items() for perm, key, pre in grants]
    if not args.apply:
        shell_common.emit(args, rows, "\n".join(f"{r['role']:<24} {r['permission']:<10} {r['key']}"
                                                for r in rows))
        return 0
    store = shell_common.open_store_from(args)
    try:
        users = {name: (role, _read_password(path, name)) for name, role, path in args.user}
        root = (_read_password(args.root_password_file, "root")
                if args.root_password_file else None)
        done = apply(store, roles=roles, users=users, root_password=root,
                     enable=args.enable_auth)
    finally:
        store.close()
    shell_common.emit(args, done, " ".join(f"{k}={','.join(v) or '-'}" for k, v in done.items()))
    return 0


shell_common.register("etcd-roles", "print or --apply the least-privilege etcd roles "
                      "(docs/operations.md, 'Securing etcd')", _args, _run,
                      writes="only with --apply: etcd roles and users (with --enable-auth, "
                             "etcd's authentication switch)")
