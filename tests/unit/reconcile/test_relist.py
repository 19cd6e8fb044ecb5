"""Re-listing finds the index entries of objects deleted while a watch was away, and only those."""

from __future__ import annotations

from eagle3_operator.reconcile.relist import collection_paths, entry_uid, index_uids, list_ghosts


def test_an_entry_uid_is_read_from_slim_bodies_and_owned_tuples():
    assert entry_uid({"metadata": {"name": "j", "uid": "u1"}}) == "u1"
    assert entry_uid(("Service", "s", "h", "u2")) == "u2"
    assert entry_uid({"metadata": {"name": "j"}}) is None
    assert entry_uid(("Service", "s", None, None)) is None


def test_index_uids_spans_every_key_of_every_index():
    jobs = {("n", "a"): [{"metadata": {"uid": "j1"}}, {"metadata": {"uid": "j2"}}], ("n", "b"): []}
    owned = {("n", "a"): [("ConfigMap", "c", "h", "c1")]}
    assert index_uids([jobs, owned]) == {"j1", "j2", "c1"}


def test_collections_are_listed_per_watched_namespace_else_cluster_wide():
    assert collection_paths("stage_jobs", []) == ["/apis/batch/v1/jobs"]
    assert collection_paths("stage_pods", ["a", "b"]) == [
        "/api/v1/namespaces/a/pods",
        "/api/v1/namespaces/b/pods",
    ]
    assert collection_paths("eagle3_runs", ["a"])[0].endswith("/namespaces/a/eagle3runs")


class _Lists:
    def __init__(self, uids: dict[str, set[str]]) -> None:
        self.uids, self.calls = uids, []

    async def list_metadata(self, path: str, label_selector: str | None = None) -> list[dict[str, str]]:
        self.calls.append((path, label_selector))
        namespace = path.split("/namespaces/")[1].split("/")[0]
        found = self.uids.get(path.rsplit("/", 1)[-1], set())
        return [{"namespace": namespace, "name": f"name-{uid}", "uid": uid} for uid in sorted(found)]


async def test_ghosts_are_what_the_indexes_held_that_no_list_returned():
    indices = {
        "eagle3_runs": {("n", "r"): [{"metadata": {"uid": "run"}}]},
        "stage_jobs": {("n", "r"): [{"metadata": {"uid": "old-job"}}, {"metadata": {"uid": "job"}}]},
    }
    kube = _Lists({"eagle3runs": {"run"}, "jobs": {"job", "created-after-the-snapshot"}})
    relisted = await list_ghosts(kube, indices, ["n"])  # type: ignore[arg-type]
    assert relisted.ghosts == {"old-job"} and relisted.held == {"run", "old-job", "job"}
    assert relisted.unseen_runs == [], "a job the index never saw is no run to reconcile"
    runs, jobs = kube.calls
    assert runs[1] is None, "runs carry no managed-by label"
    assert jobs == ("/apis/batch/v1/namespaces/n/jobs", "app.kubernetes.io/managed-by=eagle3-operator")


async def test_a_run_the_list_holds_that_no_index_saw_is_returned_to_reconcile():
    """Issue 28 item 17: a run created while the run watch was silent is in no index; the re-list finds it
    (and a run the index holds is not returned twice)."""
    indices = {"eagle3_runs": {("n", "seen"): [{"metadata": {"uid": "seen"}}]}, "stage_jobs": {}}
    kube = _Lists({"eagle3runs": {"seen", "missed"}})
    relisted = await list_ghosts(kube, indices, ["n"])  # type: ignore[arg-type]
    assert relisted.ghosts == set()
    assert relisted.unseen_runs == [{"metadata": {"namespace": "n", "name": "name-missed", "uid": "missed"}}]
