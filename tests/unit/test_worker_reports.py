"""What an EmbeddingWorker reports (core.worker_reports): it pickles as Ray carries it; the driver checks its model."""

import pickle

import numpy as np
import pytest

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.worker_reports import EmbedResult, WorkerInfo
from embedjob_worker.encode.model import ResolvedModel, check_model

INFO = WorkerInfo("m", "r1", 4, 4, 256, 1.5, 1_700_000_000.0, "a" * 32, "host/1/aaaaaaaa")


def result(revision: str = "r1") -> EmbedResult:
    return EmbedResult("b1", (1,), "m", revision, "host/1/aaaaaaaa", 0.2, 1,
                       np.arange(8, dtype=np.float32).reshape(2, 4))


def test_reports_pickle_with_their_fields_and_vectors():
    assert pickle.loads(pickle.dumps(INFO)) == INFO
    back = pickle.loads(pickle.dumps(result(), protocol=5))
    assert (back.batch_id, back.truncated, back.oom_splits) == ("b1", (1,), 1)
    assert back.vectors.dtype == np.float32 and np.array_equal(back.vectors, result().vectors)


def test_an_info_or_result_of_another_revision_is_a_model_mismatch_naming_the_worker():
    resolved = ResolvedModel("m", "r1", "/models/m", None, normalize=True, max_seq_length=256)
    check_model(INFO, resolved)
    check_model(result(), resolved)
    with pytest.raises(JobFailed, match="worker host/1/aaaaaaaa has m@r2, the job pins m@r1") as mismatch:
        check_model(result("r2"), resolved)
    assert mismatch.value.reason == "ModelMismatch"
