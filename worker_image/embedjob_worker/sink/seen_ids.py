"""Duplicate record ids decided by PostgreSQL (embedjob_seen_ids), so driver memory stays flat as the input grows."""

from __future__ import annotations

import sqlalchemy as sa

from embedjob_worker.core.errors import retry_database
from embedjob_worker.sink.runs import RunSession, update_run

# Each claimed id is stored with the lowest position it was seen at; a claim is the first
# occurrence when that lowest position is its own. The same input read again (a resumed
# run) therefore gets the same answers.
_CLAIM_SQL = sa.text("""
INSERT INTO embedjob_seen_ids AS s (run_id, record_id, position)
SELECT :run_id, c.record_id, min(c.position)
FROM unnest(CAST(:ids AS text[]), CAST(:positions AS bigint[])) AS c(record_id, position)
GROUP BY c.record_id
ON CONFLICT (run_id, record_id) DO UPDATE SET position = LEAST(s.position, excluded.position)
RETURNING position
""")
# An id scan's ids (read_ids): read after the claims, so no claim of the run's records is left to decide.
_READ_SQL = sa.text("""
INSERT INTO embedjob_seen_ids (run_id, record_id, position)
SELECT DISTINCT :run_id, r.record_id, :position FROM unnest(CAST(:ids AS text[])) AS r(record_id)
ON CONFLICT (run_id, record_id) DO NOTHING
""")
# The position an id scan's ids are kept at: past any record's, so it never makes a claim look like a duplicate.
ID_SCAN_POSITION = 2**63 - 1


class SeenIds:
    """The run's IdRegistry (records.IdRegistry) in PostgreSQL: one statement per chunk of claims, fenced by the
    driver session (runs.update_run): a superseded driver claims nothing (DriverSuperseded)."""

    def __init__(self, engine: sa.Engine, run: RunSession):
        self.engine, self.run = engine, run

    def first_occurrences(self, claims: list[tuple[str, int]]) -> set[int]:
        if not claims:
            return set()
        ids, positions = zip(*claims)
        params = {"run_id": self.run.run_id, "ids": list(ids), "positions": list(positions)}

        def claim() -> set[int]:  # a claim repeated after a lost connection returns the same positions
            with self.engine.begin() as conn:
                claimed = set(conn.execute(_CLAIM_SQL, params).scalars().all())
                update_run(conn, self.run, {})
                return claimed

        return retry_database(claim, "claim_ids")

    def read_ids(self, ids: list[str]) -> None:
        """Record `ids` as read by the run (an id scan: sync.deleteMissing keeps their vectors), fenced likewise."""
        params = {"run_id": self.run.run_id, "ids": ids, "position": ID_SCAN_POSITION}

        def record() -> None:
            with self.engine.begin() as conn:
                conn.execute(_READ_SQL, params)
                update_run(conn, self.run, {})

        retry_database(record, "read_ids")
