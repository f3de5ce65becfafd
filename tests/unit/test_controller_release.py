"""`controller.release`: the patch that releases a job from the operator (no cluster)."""

from controller import release


def test_release_patch_keeps_other_finalizers_and_pins_the_version():
    job = {"metadata": {"name": "a", "namespace": "n", "resourceVersion": "42",
                        "finalizers": ["example.com/keep", release.FINALIZER]}}
    assert release.release_patch(job) == {"metadata": {
        "resourceVersion": "42", "annotations": {release.RELEASED: "true"}, "finalizers": ["example.com/keep"]}}


def test_release_patch_of_a_job_without_finalizers():
    patch = release.release_patch({"metadata": {"name": "a", "namespace": "n", "resourceVersion": "7"}})
    assert patch["metadata"]["finalizers"] == []
