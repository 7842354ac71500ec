"""Users for a LocalCluster whose etcd runs with authentication.

On the first start ``create`` writes a random password for ``root`` and for
one user per role of ``pybk_spark.admin.commands.etcd_roles`` (``operator``,
``bookie``, ``client``) into ``<dir>/<user>.pw`` (mode 0600), applies the
role layout, and enables etcd auth.  ``security_for(user)`` is what a process
running as that user is given (the cluster's TLS files plus etcd_user /
etcd_password_file).  A restart finds the files and changes nothing.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
from pathlib import Path
from typing import Callable

from pybk_spark.admin.commands import etcd_roles
from pybk_spark.metadata import EtcdSecurity, open_store, with_security

USERS = {"operator": etcd_roles.OPERATOR, "bookie": etcd_roles.BOOKIE,
         "client": etcd_roles.CLIENT}


def password_path(directory: Path, user: str) -> Path:
    return Path(directory) / f"{user}.pw"


def security_for(base: EtcdSecurity, directory: Path, user: str) -> EtcdSecurity:
    return dataclasses.replace(base, etcd_user=user,
                               etcd_password_file=str(password_path(directory, user)))


def create(uri: str, base: EtcdSecurity, directory: Path, *,
           token: Callable[[], str] = lambda: secrets.token_urlsafe(18)) -> None:
    """Write the password files, create roles and users, enable auth."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    passwords = {}
    for user in ("root", *USERS):
        path = password_path(directory, user)
        passwords[user] = token()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(passwords[user] + "\n")
    store = open_store(with_security(uri, base))
    try:
        etcd_roles.apply(store, roles=etcd_roles.LAYOUT,
                         users={u: (role, passwords[u]) for u, role in USERS.items()},
                         root_password=passwords["root"], enable=True)
    finally:
        store.close()
