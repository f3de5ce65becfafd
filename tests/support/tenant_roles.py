"""Per-namespace database roles for tests: a fresh login role granted one namespace with `embedjob.tenants`.

The test server's own user is a superuser and plays the admin who owns the tables. Roles
are cluster-wide in PostgreSQL, so each one gets a unique suffix.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import sqlalchemy as sa

from embedjob import tenants


@dataclass(frozen=True)
class Tenant:
    role: str
    namespace: str
    url: str  # the same database, connecting as `role`

    def engine(self) -> sa.Engine:
        return sa.create_engine(self.url)


def create_role(owner_url: str, prefix: str) -> str:
    """A new login role (the test server trusts local connections: no password)."""
    role = f"{prefix}_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(owner_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN"))
    engine.dispose()
    return role


def as_role(owner_url: str, role: str) -> str:
    return sa.engine.make_url(owner_url).set(username=role).render_as_string(hide_password=False)


def tenant(owner_url: str, namespace: str) -> Tenant:
    """A role confined to `namespace`, set up as docs/install.md says (`python -m embedjob.tenants grant`)."""
    role = create_role(owner_url, namespace.replace("-", "_"))
    tenants.grant(owner_url, namespace, role)
    return Tenant(role, namespace, as_role(owner_url, role))
