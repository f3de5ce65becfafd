"""Batches in flight, matched back by the batch id their result carries (pure: no Ray)."""

from __future__ import annotations


class InFlightBatches:
    """Batches handed to actors, matched back by the batch id their result carries.

    Results arrive in completion order; looking them up by id (never by submission
    position) is what makes out-of-order completion, retries and splits safe.
    """

    def __init__(self) -> None:
        self._by_id: dict[str, object] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, batch_id: str) -> bool:
        return batch_id in self._by_id

    def attempt(self, batch_id: str) -> object:
        return self._by_id[batch_id]

    def add(self, batch_id: str, attempt: object) -> None:
        if batch_id in self._by_id:
            raise ValueError(f"batch {batch_id} is already in flight")
        self._by_id[batch_id] = attempt

    def complete(self, batch_id: str) -> object:
        """The attempt a result belongs to; KeyError for a result nobody is waiting for."""
        try:
            return self._by_id.pop(batch_id)
        except KeyError:
            raise KeyError(f"result for batch {batch_id} which is not in flight") from None
