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


class StandInCore:
    """Namespaces by name: True being deleted, False not; absent: gone."""

    def __init__(self, namespaces):
        self.namespaces = namespaces

    def read_namespace(self, name, **_):
        from types import SimpleNamespace

        from kubernetes.client.exceptions import ApiException
        if name not in self.namespaces:
            raise ApiException(status=404)
        return SimpleNamespace(metadata=SimpleNamespace(deletion_timestamp="now" if self.namespaces[name] else None))


def test_release_terminating_releases_the_jobs_of_watched_namespaces_being_deleted_only(monkeypatch):
    """Issue 26 item 4: kopf never watches a namespace already terminating when the operator starts."""
    seen = []
    monkeypatch.setattr(release.kubernetes.client, "CoreV1Api",
                        lambda client: StandInCore({"gone-soon": True, "live": False}))
    monkeypatch.setattr(release.kubernetes.client, "CustomObjectsApi", lambda client: "custom")
    monkeypatch.setattr(release, "release_jobs", lambda custom, namespaces: seen.append(namespaces) or ["gone-soon/a"])
    assert release.release_terminating(None, ("live", "gone-soon", "absent")) == ["gone-soon/a"]
    assert seen == [("gone-soon",)]
    # none being deleted: never release_jobs(()), which releases every job of the cluster
    assert release.release_terminating(None, ("live",)) == [] and seen == [("gone-soon",)]
