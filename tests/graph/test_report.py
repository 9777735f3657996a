"""``mart report``: the page a reviewer reads, drawn from a finished run's ledger, and shown in a real browser."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from mart.graph.report import write_report
from mart.graph.report_data import as_overrides, as_yaml, load_run
from mart.graph.session import tune
from mart.state.models import ReviewDecision
from tests.graph.test_graph_session import Scripted, options
from tests.support.paths import REPO

HOSTILE = "<script>alert(1)</script> & [/data/x]"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A toy two-stage session whose first review is rejected with hostile feedback, report written at the end."""
    tmp = tmp_path_factory.mktemp("report")
    reviewer = Scripted([ReviewDecision(action="reject", feedback=HOSTILE, reviewer="eve", channel="tty")])
    summary = tune(options(tmp, report=True), reviewer=reviewer)
    assert summary["status"] == "completed"
    return Path(tmp) / summary["run_id"], summary


def test_tune_writes_the_report_with_every_section(finished_run):
    run_dir, summary = finished_run
    page = Path(summary["report"])
    assert page == run_dir / "report.html" and page.is_file()
    text = page.read_text()
    for section in ("Best so far", "Phase breakdown", "Peak memory", "Learning curves", "Trials", "Reviews",
                    "Final config"):
        assert section in text, section
    # the figures are embedded (the page stands alone) and also written beside it
    assert len(re.findall(r'src="data:image/png;base64,', text)) >= 4
    assert {p.name for p in (run_dir / "report").glob("*.png")} >= {"best_so_far.png", "phases.png", "memory.png",
                                                                    "learning_curves.png"}
    # every trial of the ledger has a row
    data = load_run(run_dir)
    assert len(data.trials) == summary["trials"]["total"]
    for t in data.trials:
        assert f"<td>{t['trial_id']}</td>" in text


def test_foreign_text_is_escaped(finished_run):
    run_dir, summary = finished_run
    text = Path(summary["report"]).read_text()
    assert "<script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; [/data/x]" in text
    assert "eve" in text  # who decided is shown


def test_final_config_as_overrides_and_yaml_round_trip(finished_run):
    run_dir, _ = finished_run
    data = load_run(run_dir)
    best = data.stages["learning"]["best_config"] or data.stages["system"]["best_config"]
    cfg = __import__("json").loads(best)
    lines = as_overrides(cfg)
    assert len(lines) == len(cfg) and all("=" in line for line in lines)
    nested = yaml.safe_load(as_yaml(cfg))

    def flat(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict) and v:
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v

    assert dict(flat(nested)) == cfg


def test_markdown_format_via_the_cli(finished_run, tmp_path):
    run_dir, _ = finished_run
    out = tmp_path / "r.md"
    proc = subprocess.run([sys.executable, "-m", "mart.graph.cli", "report", str(run_dir), "--format", "md",
                           "--out", str(out)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    md = out.read_text()
    assert md.startswith(f"# mart run {run_dir.name}")
    assert "| trial | from | stage | status |" in md and "![best_so_far](report/best_so_far.png)" in md
    bad = subprocess.run([sys.executable, "-m", "mart.graph.cli", "report", str(run_dir), "--format", "pdf"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert bad.returncode != 0 and "html or md" in (bad.stdout + bad.stderr)


def test_report_of_a_folder_that_is_no_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="mart run folder"):
        write_report(tmp_path)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_the_page_renders_in_headless_chromium(finished_run, tmp_path):
    import numpy as np
    from PIL import Image

    run_dir, summary = finished_run
    shot = tmp_path / "page.png"
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--hide-scrollbars", "--window-size=1200,1600",
             f"--screenshot={shot}", Path(summary["report"]).as_uri()],
            capture_output=True, text=True, timeout=120)
    assert shot.is_file(), proc.stderr[-2000:]
    px = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
    assert (px.min(axis=1) > 245).mean() < 0.95, "the page is blank"
    # matplotlib's first colour (C0, #1f77b4) fills the bars and lines: the figures loaded and were drawn
    c0 = int((np.abs(px - [31, 119, 180]).max(axis=1) < 25).sum())
    assert c0 > 2000, f"only {c0} pixels of the figures' colour: did the images load?"
