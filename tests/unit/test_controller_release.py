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

    def list_namespace(self, **_):
        from types import SimpleNamespace

        return SimpleNamespace(items=[
            SimpleNamespace(metadata=SimpleNamespace(name=name, deletion_timestamp="now" if deleting else None))
            for name, deleting in self.namespaces.items()])


def test_release_terminating_releases_the_jobs_of_watched_namespaces_being_deleted_only(monkeypatch):
    """Issue 26 item 4: kopf never watches a namespace already terminating when the operator starts."""
    seen = []
    monkeypatch.setattr(release.kubernetes.client, "CoreV1Api",
                        lambda client: StandInCore({"gone-soon": True, "live": False, "unwatched": True}))
    monkeypatch.setattr(release.kubernetes.client, "CustomObjectsApi", lambda client: "custom")
    monkeypatch.setattr(release, "release_jobs", lambda custom, namespaces, guarded_only, timeout: seen.append(
        (namespaces, guarded_only, timeout)) or ["gone-soon/a"])
    assert release.release_terminating(None, ("live", "gone-soon", "absent")) == ["gone-soon/a"]
    # short calls: a round never waits on one for long, the next round is the retry
    assert seen == [(("gone-soon",), True, release.TERMINATING_REQUEST_TIMEOUT)]
    # none being deleted: never release_jobs(()), which releases every job of the cluster
    assert release.release_terminating(None, ("live",)) == [] and len(seen) == 1


def test_a_job_released_already_is_not_released_again_each_round():
    meta = {"name": "a", "namespace": "n", "resourceVersion": "1"}
    assert release.guarded({"metadata": {**meta, "finalizers": [release.FINALIZER]}})
    assert release.guarded({"metadata": {**meta, "annotations": {release.RELEASED: "true"},
                                         "finalizers": ["other/finalizer", release.FINALIZER]}})
    assert release.guarded({"metadata": meta})  # no finalizer yet: kopf may still add it
    assert not release.guarded({"metadata": {**meta, "annotations": {release.RELEASED: "true"}}})


def test_the_release_goes_on_every_round_from_the_start_and_outlives_a_failed_round(monkeypatch, caplog):
    """Issue 26 item 4: kopf may stop watching a namespace whose deletion our finalizer holds up."""
    import asyncio
    import logging

    rounds = iter([RuntimeError("API server away"), [], ["gone/a"]])

    def next_round(client, namespaces):
        outcome = next(rounds)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(release, "release_terminating", next_round)

    async def three_rounds():
        task = asyncio.create_task(release.release_terminating_forever(None, ("gone",), interval_seconds=0.01))
        while not any("released gone/a" in r.getMessage() for r in caplog.records):
            await asyncio.sleep(0.01)
        task.cancel()

    with caplog.at_level(logging.INFO, logger="controller.release"):
        asyncio.run(asyncio.wait_for(three_rounds(), timeout=5))
    messages = [r.getMessage() for r in caplog.records]
    assert "API server away" in messages[0] and messages[-1] == "released gone/a: its namespace is being deleted"
