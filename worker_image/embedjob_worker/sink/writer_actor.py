"""The GroupWriter Ray actor: writes groups of finished batches on its own connection, vectors from Ray's object store."""

from __future__ import annotations

import os
import socket

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.outcome import BatchOutcome
from embedjob_worker.sink.postgres import PostgresSink, open_engine
from embedjob_worker.sink.runs import RunSession
from embedjob_worker.sink.target import SinkTarget
from embedjob_worker.sink.writer import write_group


class GroupWriter:
    """One of spec.sink.writers: `write` is the driver's writer thread's group write (writer.write_group).

    The driver hands it a group's metadata (ids, texts, attempts) with the ObjectRefs of the
    vectors the EmbeddingWorkers returned; the vectors are fetched here, so they never pass
    through the driver. The database URL comes with `open`, an actor call (not the creation
    arguments, which Ray keeps in its control store).
    """

    def __init__(self) -> None:
        self.sink: PostgresSink | None = None
        self.run: RunSession | None = None
        self.worker = f"{socket.gethostname()}/{os.getpid()}"[:128]

    def open(self, url: str, target: SinkTarget, run: RunSession) -> str:
        """Connect (checked now, not at the first group) to write `run` into `target` as the driver would."""
        self.sink = PostgresSink(open_engine(url), target)
        self.run = run
        with self.sink.engine.connect():
            pass
        return self.worker

    def write(self, outcomes: list[BatchOutcome]) -> list[str]:
        """Write the group in one transaction; the ids of the batches committed (see PostgresSink.write)."""
        import ray
        from ray.exceptions import ObjectLostError

        succeeded = [o for o in outcomes if o.state == "succeeded"]
        try:
            vectors = ray.get([o.vectors for o in succeeded])
        except ObjectLostError as exc:  # its node is gone (the driver owns them: not an actor's death)
            raise JobFailed("VectorsLost", f"the vectors of a finished batch were lost before they were written: "
                                           f"{str(exc).splitlines()[0]}; a re-run embeds the batches not written")
        for outcome, batch_vectors in zip(succeeded, vectors):
            outcome.vectors = batch_vectors
        return [o.batch_id for o in write_group(self.sink, self.run, outcomes, [])]

    def close(self) -> None:
        if self.sink is not None:
            self.sink.engine.dispose()
