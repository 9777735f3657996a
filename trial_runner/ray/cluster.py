"""What one trial asks of a Ray cluster, and how many such trials the cluster holds at once.

A trial on a cluster is one Ray job. Its driver (the job's entrypoint) reserves ``entrypoint_num_cpus``,
``entrypoint_num_gpus`` and ``entrypoint_resources`` on one node, and Ray keeps the job PENDING until a node has
them free (https://docs.ray.io/en/latest/cluster/running-applications/job-submission/quickstart.html, "Specifying
CPU and GPU resources"). A GPU trainer started by the driver then asks Ray for its workers' GPUs itself: verl for
``trainer.nnodes`` groups of ``trainer.n_gpus_per_node`` GPUs, each group packed on one node (its resource pools'
``STRICT_PACK`` placement groups), MARTI for its job's GPUs wherever they are.

The cluster's nodes come from the dashboard's state API (``GET /api/v0/nodes``, the one ``ray list nodes`` reads),
through Ray's own ``StateApiClient`` with the cluster's token header.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: seconds a read of the cluster's nodes may take before the capacity counts as unknown
NODES_TIMEOUT_S = 10


@dataclass(frozen=True)
class TrialResources:
    """What one trial reserves on the cluster.

    ``num_cpus``/``num_gpus``/``resources`` are the driver's (``submit_job``'s ``entrypoint_*``; None or empty:
    Ray's default, nothing). ``gpu_groups`` x ``gpus_per_group`` are the GPUs the job's trainer asks Ray for
    itself, each group on one node when ``packed``.
    """

    num_cpus: float | None = None
    num_gpus: float | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    gpu_groups: int = 0
    gpus_per_group: int = 0
    packed: bool = True

    def submit_options(self) -> dict[str, Any]:
        """The keyword arguments of ``JobSubmissionClient.submit_job`` that reserve the driver's resources."""
        out: dict[str, Any] = {}
        if self.num_cpus is not None:
            out["entrypoint_num_cpus"] = self.num_cpus
        if self.num_gpus is not None:
            out["entrypoint_num_gpus"] = self.num_gpus
        if self.resources:
            out["entrypoint_resources"] = dict(self.resources)
        return out

    def driver(self) -> dict[str, float]:
        """The driver's reservation as Ray names the resources (what must be free on one node)."""
        out = {k: float(v) for k, v in self.resources.items() if v}
        if self.num_cpus:
            out["CPU"] = float(self.num_cpus)
        if self.num_gpus:
            out["GPU"] = float(self.num_gpus)
        return out

    @property
    def worker_gpus(self) -> int:
        return self.gpu_groups * self.gpus_per_group


def trial_resources(num_cpus: Any = None, num_gpus: Any = None, resources: Any = None, *,
                    gpu_groups: int = 0, gpus_per_group: int = 0, packed: bool = True) -> TrialResources:
    """Checked ``TrialResources`` from backend options (``entrypoint_num_cpus``, ``entrypoint_num_gpus``,
    ``entrypoint_resources``).

    Raises:
        ValueError: a count that is not a number >= 0, resources that are not a mapping of names to numbers >= 0,
            or CPU/GPU named in the resources (Ray takes those as ``entrypoint_num_cpus``/``_gpus``).
    """

    def count(name: str, value: Any) -> float | None:
        if value is None:
            return None
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(value, bool) or not math.isfinite(number) or number < 0:
            raise ValueError(f"backend option `{name}` must be a number >= 0, but got {value!r}.")
        return int(number) if number.is_integer() else number

    extra: dict[str, float] = {}
    if resources is not None:
        if not isinstance(resources, Mapping):
            raise ValueError(f"backend option `entrypoint_resources` must be a mapping of resource names to amounts "
                             f"(--backend-option 'entrypoint_resources={{mart_trial: 1}}'), but got {resources!r}.")
        for key, value in resources.items():
            if str(key).upper() in ("CPU", "GPU"):
                raise ValueError(f"backend option `entrypoint_resources` may not name {key!r}: use "
                                 f"`entrypoint_num_{str(key).lower()}s`.")
            extra[str(key)] = count(f"entrypoint_resources.{key}", value)  # type: ignore[assignment]
    return TrialResources(num_cpus=count("entrypoint_num_cpus", num_cpus),
                          num_gpus=count("entrypoint_num_gpus", num_gpus), resources=extra,
                          gpu_groups=max(0, int(gpu_groups)), gpus_per_group=max(0, int(gpus_per_group)), packed=packed)


@dataclass(frozen=True)
class Capacity:
    """How many trials the cluster holds at once, and why, for the user."""

    trials: int
    reason: str


def _amount(value: float) -> str:
    return f"{value:g}"


def _unit(name: str, n: float) -> str:
    plural = "" if n == 1 else "s"
    return {"CPU": f"CPU{plural}", "GPU": f"GPU{plural}"}.get(name, f"'{name}'")


def _on_nodes(nodes: Sequence[Mapping[str, float]], name: str) -> tuple[float, int]:
    have = [float(n.get(name, 0) or 0) for n in nodes]
    return sum(have), sum(1 for h in have if h > 0)


def capacity(nodes: Sequence[Mapping[str, float]], trial: TrialResources) -> Capacity | None:
    """How many ``trial``s ``nodes`` (each node's total resources) hold at once; None when the trial reserves
    nothing Ray counts (then nothing bounds it but Ray's scheduling).

    The driver's reservation must fit on one node: per node, the fewest times any resource it asks for fits there.
    Packed GPU groups fit per node (a node of 8 GPUs holds two groups of 4, none of 16); a trial needs
    ``gpu_groups`` of them. Unpacked GPUs count over the whole cluster. The smallest of these bounds holds.
    """
    bounds: list[Capacity] = []
    driver = trial.driver()
    if driver:
        fits = sum(min(math.floor(float(n.get(r, 0) or 0) / need) for r, need in driver.items()) for n in nodes)
        # name the resource that runs out first, over the cluster
        scarce = min(driver, key=lambda r: sum(math.floor(float(n.get(r, 0) or 0) / driver[r]) for n in nodes))
        total, where = _on_nodes(nodes, scarce)
        bounds.append(Capacity(fits, f"{_amount(total)} {_unit(scarce, total)} on {where} node(s), "
                                     f"{_amount(driver[scarce])} per trial"))
    if trial.worker_gpus:
        total, where = _on_nodes(nodes, "GPU")
        if trial.packed:
            groups = sum(math.floor(float(n.get("GPU", 0) or 0) / trial.gpus_per_group) for n in nodes)
            fits = groups // trial.gpu_groups
            per = (f"{trial.gpus_per_group} per trial" if trial.gpu_groups == 1 else
                   f"{trial.gpu_groups} nodes x {trial.gpus_per_group} per trial")
        else:
            fits = math.floor(total / trial.worker_gpus)
            per = f"{trial.worker_gpus} per trial"
        bounds.append(Capacity(fits, f"{_amount(total)} {_unit('GPU', total)} on {where} node(s), {per}"))
    return min(bounds, key=lambda b: b.trials) if bounds else None


def read_nodes(address: str, token: str | None, timeout_s: float = NODES_TIMEOUT_S) -> list[dict[str, float]]:
    """Each live node's total resources (``resources_total``), from the dashboard's state API.

    Raises:
        Exception: whatever Ray's client raises (no ``ray[default]``, cluster unreachable, a refused token).
    """
    from ray.util.state import StateApiClient
    from ray.util.state.common import ListApiOptions, StateResource

    headers = {"Authorization": f"Bearer {token}"} if token else None
    client = StateApiClient(address=address, headers=headers)
    nodes = client.list(StateResource.NODES, options=ListApiOptions(
        detail=True, limit=10_000, timeout=int(timeout_s), filters=[("state", "=", "ALIVE")]),
        raise_on_missing_output=False)
    out = []
    for node in nodes:
        total = node.get("resources_total") if isinstance(node, dict) else getattr(node, "resources_total", None)
        out.append({str(k): float(v) for k, v in (total or {}).items()})
    return out


class RayCluster:
    """The cluster a backend's trials run on, read once per backend (its nodes do not change during a session
    often enough to be worth a request per decision).

    ``nodes()`` is None when they cannot be read (said once, as a warning): the capacity is then unknown.
    """

    def __init__(self, address: str, token: str | None = None) -> None:
        from mart.trial_runner.ray.address import normalize_address

        self.address = normalize_address(address)
        self.token = token
        self._nodes: list[dict[str, float]] | None = None
        self._read = False
        self.error: str | None = None

    def nodes(self) -> list[dict[str, float]] | None:
        if not self._read:
            self._read = True
            from mart.trial_runner.ray.address import find_token

            try:
                self._nodes = read_nodes(self.address, find_token(self.token))
            except Exception as e:  # noqa: BLE001 - unknown capacity, never a failed session
                self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                import warnings

                warnings.warn(f"Ray cluster {self.address}: its nodes' resources could not be read ({self.error}): how "
                              "many trials it holds at once is unknown (mart runs what --parallel asks; Ray queues what "
                              "does not fit)", stacklevel=3)
        return self._nodes

    def capacity(self, trial: TrialResources) -> Capacity | None:
        nodes = self.nodes()
        return None if nodes is None else capacity(nodes, trial)

    def gpus_per_node(self) -> int | None:
        """The GPUs of the smallest GPU node (a trial of that many fits on any of them); None without GPU nodes."""
        gpus = [int(n.get("GPU", 0)) for n in self.nodes() or () if n.get("GPU", 0) >= 1]
        return min(gpus) if gpus else None


def slots_on(cluster: RayCluster, trial: TrialResources) -> int | None:
    """``Backend.max_parallel_trials`` on a cluster: the trials it holds (at least one: a trial that fits nowhere
    now waits in Ray's queue), None when unknown."""
    cap = cluster.capacity(trial)
    return None if cap is None else max(1, cap.trials)


def slots_reason(cluster: RayCluster, trial: TrialResources) -> str:
    """``Backend.parallel_limit_reason`` on a cluster, e.g. "16 GPUs on 2 node(s), 8 per trial"."""
    cap = cluster.capacity(trial)
    if cap is None:
        return f"the cluster's resources could not be read ({cluster.error})" if cluster.error else \
            "a trial reserves nothing the cluster counts"
    return cap.reason if cap.trials else f"{cap.reason}: none fits now, Ray queues the trial until one does"


class RayJobSizing:
    """A backend whose trials run as Ray jobs when it has a ``ray_address``: each trial's reservation, from its
    ``entrypoint_num_cpus``/``entrypoint_num_gpus``/``entrypoint_resources`` options over the backend's defaults,
    and how many such trials the cluster holds (``Backend.max_parallel_trials`` there).

    A backend calls ``_init_ray_sizing`` from its constructor and may override ``_ray_default_cpus`` (what its
    driver needs: the local workload's threads) and ``_ray_gpu_groups`` (the GPUs its trainer asks Ray for).
    """

    ray_address: str | None
    _ray_options: dict[str, Any]
    _cluster: RayCluster | None = None

    def _init_ray_sizing(self, ray_address: str | None, entrypoint_num_cpus: Any = None,
                         entrypoint_num_gpus: Any = None, entrypoint_resources: Any = None) -> None:
        given = {k: v for k, v in (("entrypoint_num_cpus", entrypoint_num_cpus),
                                   ("entrypoint_num_gpus", entrypoint_num_gpus),
                                   ("entrypoint_resources", entrypoint_resources)) if v is not None}
        if given and not ray_address:
            raise ValueError(f"backend option(s) {', '.join(f'`{k}`' for k in given)} size a trial's Ray job: they "
                             "need `ray_address` (--ray-address http://HEAD:8265).")
        trial_resources(entrypoint_num_cpus, entrypoint_num_gpus, entrypoint_resources)  # refuse bad values now
        self._ray_options = given

    def _ray_default_cpus(self) -> float | None:
        """CPUs a trial's driver reserves unless ``entrypoint_num_cpus`` says otherwise (None: Ray's default, 0)."""
        return None

    def _ray_gpu_groups(self) -> tuple[int, int, bool]:
        """(groups, GPUs per group, each group on one node) the trial's trainer asks Ray for; none by default."""
        return 0, 0, True

    def ray_trial_resources(self) -> TrialResources:
        opts = self._ray_options
        groups, per_group, packed = self._ray_gpu_groups()
        return trial_resources(opts.get("entrypoint_num_cpus", self._ray_default_cpus()),
                               opts.get("entrypoint_num_gpus"), opts.get("entrypoint_resources"),
                               gpu_groups=groups, gpus_per_group=per_group, packed=packed)

    def ray_runner_options(self) -> dict[str, Any]:
        """``RayJobRunner``'s keyword arguments that size each trial's job."""
        r = self.ray_trial_resources()
        return {"entrypoint_num_cpus": r.num_cpus, "entrypoint_num_gpus": r.num_gpus,
                "entrypoint_resources": dict(r.resources) or None}

    def ray_cluster(self) -> RayCluster:
        if self._cluster is None:
            assert self.ray_address, "ray_cluster() needs a ray_address"
            self._cluster = RayCluster(self.ray_address)
        return self._cluster

    def _ray_slots(self) -> int | None:
        return slots_on(self.ray_cluster(), self.ray_trial_resources())

    def _ray_slots_reason(self) -> str:
        return slots_reason(self.ray_cluster(), self.ray_trial_resources())


__all__ = ["Capacity", "RayCluster", "RayJobSizing", "TrialResources", "capacity", "read_nodes", "slots_on",
           "slots_reason", "trial_resources"]
