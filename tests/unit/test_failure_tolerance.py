"""How many failed batches a job tolerates: a count, or a percentage of all its batches."""

from embedjob.api import Retry
from embedjob_worker.core.errors import too_many_failed_batches


def test_a_count_stops_the_job_at_the_first_batch_over_it():
    retry = Retry(failed_batches_tolerated=2)
    assert too_many_failed_batches(retry, 2, None, "x") is None
    failure = too_many_failed_batches(retry, 3, None, "last: ActorDied: gone")
    assert failure.reason == "TooManyFailedBatches"
    assert "3 batch(es) failed" in str(failure) and "failedBatchesTolerated=2" in str(failure)


def test_a_percentage_is_of_all_batches_and_the_larger_allowance_wins():
    retry = Retry(failed_batches_tolerated=1, failed_batches_tolerated_percent=10)
    assert too_many_failed_batches(retry, 10, 100, "x") is None  # 10% of 100
    failure = too_many_failed_batches(retry, 11, 100, "x")
    assert failure is not None and "failedBatchesToleratedPercent=10.0 of 100 batches" in str(failure)
    assert too_many_failed_batches(retry, 1, 5, "x") is None  # the count (1) is more than 10% of 5
    assert too_many_failed_batches(retry, 2, 5, "x") is not None
