"""API keys -> principals (a tenant, and whether it is an admin).

``SWARM_API_KEYS="key1=tenant1,sha256:<hex>=tenant2"`` and ``SWARM_ADMIN_KEYS="key3,sha256:<hex>"``;
both empty turns auth off (every caller is tenant ``default`` with admin rights: the local,
single-user stack). Only SHA-256 digests of the keys are kept in memory, and a presented key is
compared against every digest in constant time, so neither a memory dump nor response timing
gives a key away. API keys are long random tokens, so an unsalted fast hash is enough here (it
is not a password store).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from swarm_contracts.names import check_name

DEFAULT_TENANT = "default"
ADMIN_TENANT = "admin"
_HASHED = re.compile(r"^sha256:([0-9a-fA-F]{64})$")


@dataclass(frozen=True)
class Principal:
    tenant: str
    admin: bool = False


@dataclass(frozen=True)
class KeyTable:
    """SHA-256 digest of each key -> its principal. Empty means auth is off."""

    digests: tuple[tuple[bytes, Principal], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.digests)

    def lookup(self, presented: str) -> Principal | None:
        digest = hashlib.sha256(presented.encode()).digest()
        found = None
        # No early exit: every entry is compared, so timing does not depend on which matched.
        for known, principal in self.digests:
            if hmac.compare_digest(known, digest):
                found = principal
        return found


def hash_key(key: str) -> str:
    """The ``sha256:<hex>`` form of a key, for SWARM_API_KEYS/SWARM_ADMIN_KEYS."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _digest(key: str) -> bytes:
    hashed = _HASHED.match(key)
    return bytes.fromhex(hashed.group(1)) if hashed else hashlib.sha256(key.encode()).digest()


def _check_tenant(tenant: str) -> str:
    # Tenants end up in KV keys and store keys: the one naming rule.
    return check_name(tenant, "tenant")


def parse_api_keys(spec: str, admin_spec: str = "") -> KeyTable:
    """Parse the key lists at start-up so that a typo fails loudly rather than locking users out."""
    entries: dict[bytes, Principal] = {}
    for item in (i.strip() for i in spec.split(",")):
        if not item:
            continue
        # rpartition: a plain key may itself contain "=" (base64), a tenant never does.
        key, sep, tenant = item.rpartition("=")
        key, tenant = key.strip(), tenant.strip()
        if not sep or not key or not tenant:
            raise ValueError("a SWARM_API_KEYS entry is not 'key=tenant' or 'sha256:<hex>=tenant'")
        tenant = _check_tenant(tenant)
        entries[_digest(key)] = Principal(tenant, admin=tenant == ADMIN_TENANT)
    for key in (i.strip() for i in admin_spec.split(",")):
        if key:
            entries[_digest(key)] = Principal(ADMIN_TENANT, admin=True)
    return KeyTable(tuple(entries.items()))


def current_principal(request: Request) -> Principal:
    keys: KeyTable = request.app.state.api_keys
    if not keys:
        return Principal(DEFAULT_TENANT, admin=True)
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = keys.lookup(token.strip())
    if principal is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="unknown API key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return principal


def current_tenant(principal: Annotated[Principal, Depends(current_principal)]) -> str:
    return principal.tenant


def require_admin(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    if not principal.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="this needs an admin API key")
    return principal


Caller = Annotated[Principal, Depends(current_principal)]
Tenant = Annotated[str, Depends(current_tenant)]
Admin = Annotated[Principal, Depends(require_admin)]
