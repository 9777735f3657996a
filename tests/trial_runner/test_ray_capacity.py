"""How many trials a Ray cluster holds at once (``mart.trial_runner.ray.cluster``), from its nodes' total resources
and one trial's reservation; the ``entrypoint_*`` backend options and their errors.

The counts are worked out by hand from the node lists (packing per node, not totals); the real cluster read is in
tests/trial_runner/test_ray_parallel.py.
"""

from __future__ import annotations

import sys

import pytest

from mart.trial_runner.ray import cluster
from mart.trial_runner.ray.cluster import TrialResources, capacity, trial_resources
from mart.trial_runner.registry import load_backend
from tests.support.paths import FAKE_VERL


def gpu_nodes(*gpus: int) -> list[dict[str, float]]:
    return [{"CPU": 64.0, "GPU": float(g), "memory": 1e12} for g in gpus]


def verl_trial(nnodes: int, per_node: int, **driver) -> TrialResources:
    return trial_resources(**driver, gpu_groups=nnodes, gpus_per_group=per_node, packed=True)


@pytest.mark.parametrize("nodes, nnodes, per_node, fits, reason", [
    (gpu_nodes(8, 8), 1, 8, 2, "16 GPUs on 2 node(s), 8 per trial"),
    (gpu_nodes(8, 8, 8, 8), 1, 8, 4, "32 GPUs on 4 node(s), 8 per trial"),  # four whole-node trials, four nodes
    (gpu_nodes(8, 8, 8, 8), 2, 8, 2, "32 GPUs on 4 node(s), 2 nodes x 8 per trial"),  # two nodes each
    (gpu_nodes(8, 8), 1, 4, 4, "16 GPUs on 2 node(s), 4 per trial"),  # two per node
    (gpu_nodes(4, 8), 1, 8, 1, "12 GPUs on 2 node(s), 8 per trial"),  # 12 GPUs, but only one node holds 8
    (gpu_nodes(6, 6), 1, 4, 2, "12 GPUs on 2 node(s), 4 per trial"),  # 12 // 4 would say 3: a group stays on a node
    (gpu_nodes(8) + [{"CPU": 16.0}], 1, 8, 1, "8 GPUs on 1 node(s), 8 per trial"),  # a CPU-only head counts no GPU
])
def test_verl_trials_fit_per_node(nodes, nnodes, per_node, fits, reason):
    cap = capacity(nodes, verl_trial(nnodes, per_node))
    assert (cap.trials, cap.reason) == (fits, reason)


def test_the_drivers_reservation_fits_on_one_node_and_the_scarcest_bound_holds():
    nodes = [{"CPU": 3.0, "GPU": 8.0}, {"CPU": 3.0, "GPU": 8.0}]
    # 2 CPUs per driver: one per node (6 CPUs in all would say 3)
    cap = capacity(nodes, trial_resources(num_cpus=2))
    assert (cap.trials, cap.reason) == (2, "6 CPUs on 2 node(s), 2 per trial")
    # with 4-GPU groups the GPUs would hold 4 trials; the drivers' CPUs hold 2
    assert capacity(nodes, verl_trial(1, 4, num_cpus=2)).trials == 2
    # a custom resource given to one node only (one token per node: one trial per node)
    tokens = [{"CPU": 8.0, "mart_trial": 1.0}, {"CPU": 8.0, "mart_trial": 1.0}, {"CPU": 8.0}]
    cap = capacity(tokens, trial_resources(num_cpus=1, resources={"mart_trial": 1}))
    assert (cap.trials, cap.reason) == (2, "2 'mart_trial' on 2 node(s), 1 per trial")
    assert capacity(tokens, trial_resources(resources={"other": 1})).trials == 0


def test_unpacked_gpus_count_over_the_cluster_and_a_trial_asking_nothing_is_unbounded():
    # MARTI's placement groups are not bound to one node: 6 GPUs fit on two 4-GPU nodes
    cap = capacity(gpu_nodes(4, 4), trial_resources(gpu_groups=1, gpus_per_group=6, packed=False))
    assert (cap.trials, cap.reason) == (1, "8 GPUs on 2 node(s), 6 per trial")
    assert capacity(gpu_nodes(4, 4), trial_resources(gpu_groups=1, gpus_per_group=6, packed=True)).trials == 0
    assert capacity(gpu_nodes(8), TrialResources()) is None


@pytest.mark.parametrize("kwargs, message", [
    ({"num_cpus": -1}, "`entrypoint_num_cpus` must be a number >= 0"),
    ({"num_gpus": "many"}, "`entrypoint_num_gpus` must be a number >= 0"),
    ({"num_cpus": True}, "`entrypoint_num_cpus` must be a number >= 0"),
    ({"resources": ["mart_trial"]}, "`entrypoint_resources` must be a mapping"),
    ({"resources": {"GPU": 1}}, "may not name 'GPU': use `entrypoint_num_gpus`"),
    ({"resources": {"mart_trial": -1}}, "`entrypoint_resources.mart_trial` must be a number >= 0"),
])
def test_bad_reservations_are_refused_with_the_option_and_the_rule(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        trial_resources(**kwargs)


def test_the_options_size_a_ray_job_and_need_a_cluster():
    with pytest.raises(ValueError, match="`entrypoint_num_cpus`.*need `ray_address`"):
        load_backend("local", entrypoint_num_cpus=2)
    with pytest.raises(ValueError, match="`entrypoint_resources` must be a mapping"):
        load_backend("local", ray_address="127.0.0.1:8265", entrypoint_resources="mart_trial")
    runner = load_backend("local", ray_address="127.0.0.1:8265", entrypoint_num_cpus=2,
                          entrypoint_resources={"mart_trial": 1}).make_runner()
    assert runner.resources.submit_options() == {"entrypoint_num_cpus": 2, "entrypoint_resources": {"mart_trial": 1}}
    # the defaults: the local workload one CPU per trainer thread; verl's driver nothing (its workers ask for GPUs)
    assert load_backend("local", ray_address="127.0.0.1:8265").make_runner().resources.submit_options() == \
        {"entrypoint_num_cpus": 1}
    verl = load_backend("verl", entrypoint=f"{sys.executable} {FAKE_VERL}", ray_address="127.0.0.1:8265",
                        base_config={"trainer.n_gpus_per_node": 8})
    assert verl.make_runner().resources.submit_options() == {}


def test_a_verl_trial_is_one_whole_node_of_the_cluster_by_default(monkeypatch):
    # the cluster read at its boundary: two 4-GPU nodes and a CPU head (what the dashboard would list); verl's own
    # default (8 GPUs per node) would fit none of them
    monkeypatch.setattr(cluster, "read_nodes", lambda address, token, timeout_s=10: gpu_nodes(4, 4) + [{"CPU": 8.0}])
    verl = load_backend("verl", entrypoint=f"{sys.executable} {FAKE_VERL}", ray_address="127.0.0.1:8265")
    base = verl.base_config()
    assert base["trainer.n_gpus_per_node"] == 4 and base.get("trainer.nnodes", 1) == 1
    assert verl.max_parallel_trials() == 2 and verl.parallel_limit_reason() == "8 GPUs on 2 node(s), 4 per trial"
    # the user's own shape wins: two nodes per trial on a cluster of two holds one
    two = load_backend("verl", entrypoint=f"{sys.executable} {FAKE_VERL}", ray_address="127.0.0.1:8265",
                       base_config={"trainer.nnodes": 2, "trainer.n_gpus_per_node": 4})
    assert two.max_parallel_trials() == 1 and two.parallel_limit_reason().endswith("2 nodes x 4 per trial")


class _Head:
    """A job API that answers Ray's "no agent yet" 500 ``busy`` times, then accepts; ``made`` is what it created."""

    def __init__(self, busy: int, error: str = "No available agent to submit job, please try again later.") -> None:
        self.busy, self.error, self.made = busy, error, []

    def submit_job(self, submission_id, **kwargs):
        if self.busy:
            self.busy -= 1
            raise RuntimeError(f"Request failed with status code 500: {self.error}.")
        self.made.append(submission_id)
        return submission_id

    def get_job_status(self, submission_id):
        if submission_id not in self.made:
            raise RuntimeError("Request failed with status code 404: Job does not exist.")
        return "PENDING"


def test_a_submission_rides_out_a_head_without_its_job_agent_yet(monkeypatch):
    from mart.trial_runner.ray import runner

    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    head = _Head(busy=3)
    assert runner.submit_with_retry(head, submission_id="mart-a-1", entrypoint="true") == "mart-a-1"
    assert head.made == ["mart-a-1"]  # submitted once it could be, once
    other = _Head(busy=1, error="Job with submission_id mart-a-1 already exists")
    with pytest.raises(RuntimeError, match="already exists"):  # any other refusal is the caller's
        runner.submit_with_retry(other, submission_id="mart-a-1", entrypoint="true")
    stuck = _Head(busy=10**9)
    with pytest.raises(RuntimeError, match="No available agent"):  # and the wait has an end
        runner.submit_with_retry(stuck, submission_id="mart-b-1", entrypoint="true", retry_s=0)
