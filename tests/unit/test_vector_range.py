"""Which vectors a pgvector type can store (core.vector_range), and what is said of one it cannot."""

import numpy as np

from embedjob_worker.core.vector_range import largest_components, out_of_range, why_out_of_range


def test_nan_infinite_and_beyond_halfvec_are_found_per_type_and_said():
    vectors = np.array([[0.5, -0.25], [np.nan, 0.0], [1.0, -np.inf], [-7e4, 1.0], [65504.0, 0.0]], dtype=np.float32)
    largest = largest_components(vectors)
    assert largest[0] == 0.5 and np.isnan(largest[1]) and largest[2] == np.inf and largest[3:] == (7e4, 65504.0)
    assert out_of_range(largest, "vector") == [1, 2]
    assert out_of_range(largest, "halfvec") == [1, 2, 3]
    assert why_out_of_range(largest[1], "vector") == "a component is NaN"
    assert why_out_of_range(largest[2], "halfvec") == "a component is infinite"
    assert why_out_of_range(largest[3], "halfvec") == ("a component (70000) is beyond halfvec's range (±65504); "
                                                       "use vectorType vector")
    assert largest_components(np.empty((0, 4), dtype=np.float32)) == ()
