"""A gain is printed with the two figures it compares, and they add up, in every channel: ``--json``, the terminal's
table, the report's headline and its system plot. With several slots the baseline is cut at its early look, so the
gain compares both configs over the steps the baseline ran, not the best's whole-window figure (issue 47: the
header read ``618 (step 2) -> 1,217, +77.4%`` although 1,217 / 618 is +97%).

The oracles are the ledger's metric rows (each trial's throughput per step), not the summary."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mart.state.ledger import Ledger
from mart.state.metrics import THROUGHPUT_KEY, mean_over_steps
from tests.support.cli import cli


@pytest.fixture(scope="module")
def parallel_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("parallel2")
    out = cli("tune", "--backend", "sim", "--backend-option", "scenario=qwen3-0.6b-1x8", "--backend-option",
              "clock=virtual", "--backend-option", "seed=0", "--approve", "auto", "--stages", "system",
              "--system-trials", "6", "--system-horizon", "6", "--parallel", "2", "--watch-interval-s", "0.001",
              # the selecting measurements' figures (a re-measured gain's: tests/nodes/test_decisions_under_noise.py)
              "--system-remeasure-share", "0",
              "--runs-dir", str(runs), "--json", "-q")
    assert out.exit_code == 0, out.output
    return runs, json.loads(out.stdout)


def test_the_json_gain_is_the_ratio_of_the_two_figures_beside_it(parallel_run):
    runs, summary = parallel_run
    part = summary["system"]
    cmp_ = part["comparison"]
    assert part["baseline_cut"], "precondition: with two slots the baseline was cut at its look (seed 0)"
    assert cmp_["gain_pct"] == pytest.approx((cmp_["best"] / cmp_["baseline"] - 1) * 100, rel=1e-5)
    # the existing keys say the same: one computation
    assert part["throughput_gain_pct"] == cmp_["gain_pct"] and part["baseline_throughput"] == cmp_["baseline"]
    assert part["baseline_steps"] == cmp_["steps"]
    # the compared best figure is the best trial's over the baseline's steps, from its metric rows
    ledger = Ledger.open(runs / summary["run_id"])
    row = {r["stage"]: r for r in ledger.table_rows("stage_results")}["system"]
    same = mean_over_steps(ledger.metric_records(row["best_trial"]), THROUGHPUT_KEY, *cmp_["steps"])
    own = mean_over_steps(ledger.metric_records(row["best_trial"]), THROUGHPUT_KEY, *part["best_steps"])
    base = mean_over_steps(ledger.metric_records(row["baseline_trial"]), THROUGHPUT_KEY, *cmp_["steps"])
    ledger.close()
    assert cmp_["best"] == pytest.approx(same, rel=1e-5) and cmp_["baseline"] == pytest.approx(base, rel=1e-5)
    assert part["best_throughput"] == pytest.approx(own, rel=1e-5)
    # the bug: the gain over the best's whole-window figure, which no one compared
    assert part["throughput_gain_pct"] != pytest.approx((own / base - 1) * 100, rel=1e-3)


def _numbers(text: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?![\d])", text)]


def test_the_terminal_and_the_report_print_the_gain_beside_the_figures_it_compares(parallel_run):
    runs, summary = parallel_run
    run, cmp_ = summary["run_id"], summary["system"]["comparison"]
    terminal = cli("resume", run, "--runs-dir", str(runs)).stdout
    line = next(x for x in terminal.splitlines() if "system (tok/s/GPU)" in x)
    gain = float(re.search(r"([+-]\d+\.\d)%", line).group(1))
    # the first two figures of the row are the compared ones (the step window after each), and they add up
    figures = [n for n in _numbers(line.split("tok/s/GPU)")[1]) if n >= 100]
    assert figures[:2] == [round(cmp_["baseline"]), round(cmp_["best"])], line
    assert gain == pytest.approx((cmp_["best"] / cmp_["baseline"] - 1) * 100, abs=0.05)
    assert f"{summary['system']['best_throughput']:,.0f} over steps 3-5" in line  # the best's own figure, named

    report = Path(cli("report", run, "--runs-dir", str(runs), "--format", "md").stdout.strip()).read_text()
    report = re.sub(r"\\(.)", r"\1", report)  # as Markdown renders it (the report escapes its text)
    head = next(x for x in report.splitlines() if x.startswith("- **system stage**"))
    assert f"{cmp_['baseline']:,.0f}" in head and f"{cmp_['best']:,.0f}" in head and f"{gain:+.1f}%" in head
    verdict = next(x for x in report.splitlines() if x.startswith("- **system verdict**"))
    assert f"gain {gain:+.1f}% = {cmp_['best']:,.0f} / {cmp_['baseline']:,.0f} - 1" in verdict, verdict


def test_the_report_system_plot_draws_the_cut_baseline_as_compared(parallel_run):
    from mart.graph.report_data import load_run, system_best

    runs, summary = parallel_run
    drawn = system_best(load_run(runs / summary["run_id"]))
    ledger = Ledger.open(runs / summary["run_id"])
    rows = ledger.trials("system")
    ledger.close()
    first = next(i for i, r in enumerate(rows, 1) if r["kind"] == "baseline")
    assert rows[first - 1]["throughput"] is None, "precondition: the cut baseline has no whole-window figure"
    assert drawn.baseline == summary["system"]["comparison"]["baseline"] and drawn.baseline_x == first
    assert drawn.baseline_steps == summary["system"]["comparison"]["steps"]
