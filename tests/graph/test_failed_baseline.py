"""An OOM'd baseline (issue 15): never reported as a score, said in the summary and in --json's notes."""

from __future__ import annotations

from mart.graph.session import SUMMARY_KEYS, tune
from mart.state.ledger import Ledger
from mart.state.options import TuneOptions
from tests.support.toy_backend import CKPT, MB, ToyBackend

OOM_BASE = {MB: 40, CKPT: False}  # toy memory 1 + 0.1 x 40 + 0.08 = 5.1 GB > the 4 GB capacity: OOM at step 1


class OomBaselineBackend(ToyBackend):
    def base_config(self) -> dict:
        return {**super().base_config(), **OOM_BASE}


class AlwaysOomBackend(ToyBackend):
    """Every config runs out of memory: the honest answer is "no feasible config"."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.capacity = 0.5

    def base_config(self) -> dict:
        return {**super().base_config(), **OOM_BASE}


def make_oom_baseline(**options):
    return OomBaselineBackend(**options)


def make_always_oom(**options):
    return AlwaysOomBackend(**options)


def _tune(tmp_path, factory: str, **kw):
    opts = dict(backend=f"tests.graph.test_failed_baseline:{factory}", approve="auto", runs_dir=str(tmp_path),
                system_trials=4, learning_trials=2, system_horizon=5, learning_horizon=6, watch_interval_s=0.01,
                quiet=True)
    opts.update(kw)
    return tune(TuneOptions(**opts))


def test_oom_baseline_has_no_score_and_the_summary_says_so(tmp_path):
    summary = _tune(tmp_path, "make_oom_baseline")
    assert "notes" in SUMMARY_KEYS  # --json carries them
    assert summary["system"]["baseline_throughput"] is None
    assert any("baseline oom" in n for n in summary["notes"]), summary["notes"]
    ledger = Ledger.open(tmp_path / summary["run_id"])
    base = next(t for t in ledger.trials() if t["stage"] == "system" and t["kind"] == "baseline")
    assert base["status"] == "oom" and base["throughput"] is None
    best = summary["system"]["best_throughput"]
    if best is not None:  # a candidate fixed the memory: it completed within the margin
        assert summary["system"]["best_peak_memory_gb"] <= summary["system"]["memory_limit_gb"]
        assert summary["system"]["best_config"]
    else:
        assert any("no feasible config" in n for n in summary["notes"])


def test_no_feasible_config_is_an_honest_summary_and_skips_stage_2(tmp_path):
    summary = _tune(tmp_path, "make_always_oom")
    assert summary["system"]["best_throughput"] is None and summary["system"]["baseline_throughput"] is None
    assert any("system stage: no feasible config" in n for n in summary["notes"]), summary["notes"]
    assert any("skipped" in n for n in summary["notes"])
    ledger = Ledger.open(tmp_path / summary["run_id"])
    assert all(t["stage"] == "system" for t in ledger.trials())  # stage 2 did not rerun a failing config
    assert all(t["throughput"] is None for t in ledger.trials())  # no score from a failed trial
    assert summary["learning"]["best_score"] is None and summary["learning"]["baseline_score"] is None


class KilledOnceBackend(ToyBackend):
    """The learning baseline's first run is killed from outside (as a lost node or an OOM killer would)."""

    def make_runner(self):
        runner = super().make_runner()
        real = runner.launch

        def launch(spec):
            handle = real(spec)
            if spec.trial_id.startswith("lea-") and spec.trial_id.endswith("-baseline"):
                from mart.trial_runner.base import write_status

                write_status(spec.trial_dir, "failed", "killed by SIGKILL without writing a status", 1)
            return handle

        runner.launch = launch
        return runner


def make_killed_once(**options):
    return KilledOnceBackend(**options)


def test_a_killed_learning_baseline_runs_once_more_and_the_stage_goes_on(tmp_path):
    summary = _tune(tmp_path, "make_killed_once", learning_trials=3, learning_confirm_trials=0)
    ledger = Ledger.open(tmp_path / summary["run_id"])
    learning = ledger.trials("learning")
    kinds = [(t["trial_id"].split("-", 2)[-1], t["status"]) for t in learning]
    assert kinds[0] == ("baseline", "failed") and kinds[1] == ("baseline-retry", "completed"), kinds
    assert summary["learning"]["baseline_score"] is not None  # the retry is the stage's baseline
    assert len(learning) == 3  # the retry counts in the stage's budget: one candidate after it
    assert not any("learning stage ended early" in n for n in summary["notes"])
