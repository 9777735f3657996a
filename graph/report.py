"""``mart report RUN``: one self-contained HTML page (or Markdown) of a run, drawn from its ledger.

What a reviewer wants at a glance: best-so-far per stage against the baseline, where each system trial
spent its step (phase breakdown), peak memory against the limit, how well the predictions matched, the
learning curves with the health monitor's stops, who decided what, and the final config as verl
overrides and as YAML. Figures are matplotlib PNGs, written beside the page and embedded in it (data URIs),
so the HTML file can be mailed or attached on its own.

The ledger is opened read-only; every string from it (feedback, reasons, configs) is foreign text and is
escaped before it reaches the page. The figures are read by ``mart.graph.report_data`` and drawn by
``mart.graph.report_plots``; this module writes the page.
"""

from __future__ import annotations

import base64
from pathlib import Path

from mart.graph.report_data import (
    LEARNING_PLOT_RULE,
    REVIEW_HEADER,
    SCHEDULE_HEADER,
    TRIAL_HEADER,
    RunData,
    as_overrides,
    as_yaml,
    curve_panels,
    final_config,
    headline,
    load_run,
    review_rows,
    schedule_rows,
    trial_rows,
)
from mart.graph.report_plots import draw_figures
from mart.state.files import write_atomic
from mart.state.text import html_text, md_fence, md_text, plain

REPORT_DIR = "report"
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f4f4f4}img{max-width:100%;border:1px solid #eee}
pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:.85em}.muted{color:#777}
"""


def _table_html(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html_text(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html_text(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _img_html(path: Path, alt: str) -> str:
    b64 = base64.b64encode(path.read_bytes()).decode()
    return f'<p><img alt="{html_text(alt)}" src="data:image/png;base64,{b64}"></p>'


def render_html(data: RunData) -> str:
    cfg = final_config(data)
    figs = data.figures
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>mart run {html_text(data.run_id)}"
             f"</title><style>{_CSS}</style></head><body>",
             f"<h1>mart run {html_text(data.run_id)}</h1>",
             f"<p class='muted'>status: {html_text(data.status)} · backend: "
             f"{html_text(str(data.options.get('backend', '?')))} · {len(data.trials)} trials</p>"]
    if headline(data):
        parts.append(_table_html(["", "baseline → best"], [[a, b] for a, b in headline(data)]))
    sections = [("Best so far", "best_so_far"), ("Trials in parallel slots", "timeline"),
                ("Best so far against wall clock", "best_vs_time"), ("Phase breakdown of system trials", "phases"),
                ("Peak memory against the limit", "memory"), ("Predicted against measured", "calibration"),
                (f"Learning curves: {', '.join(curve_panels(data))} (dotted line: the health monitor stopped the "
                 "trial)", "learning_curves"),
                ("Schedule tree (stage 3)", "schedule_tree")]
    for title, key in sections:
        if key in figs:
            parts.append(f"<h2>{html_text(title)}</h2>" + _img_html(figs[key], title))
            if key == "best_so_far" and data.stage_trials("learning"):
                parts.append(f"<p class='muted'>{html_text(LEARNING_PLOT_RULE)}</p>")
    if schedule_rows(data):
        parts.append("<h2>Schedule (stage 3)</h2>" + _table_html(SCHEDULE_HEADER, schedule_rows(data)))
    parts.append("<h2>Trials</h2>" + _table_html(TRIAL_HEADER, trial_rows(data)))
    if data.health:
        parts.append("<h2>Health events</h2>" + _table_html(
            ["trial", "step", "rule", "severity", "message"],
            [[e["trial_id"], str(e["step"]), e["rule"], e["severity"], e["message"] or ""] for e in data.health]))
    parts.append("<h2>Reviews</h2>" + (_table_html(REVIEW_HEADER, review_rows(data)) if data.reviews
                                       else "<p class='muted'>no reviews</p>"))
    parts.append("<h2>Final config</h2>")
    if cfg:
        parts.append("<p>As verl overrides:</p><pre>" + html_text(" \\\n".join(as_overrides(cfg))) + "</pre>")
        parts.append("<p>As YAML:</p><pre>" + html_text(as_yaml(cfg)) + "</pre>")
    else:
        parts.append("<p class='muted'>no stage has finished yet</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _md_cell(text: str) -> str:
    return md_text(text)  # foreign text: no raw HTML, links, images or table breaks


def _table_md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(data: RunData) -> str:
    cfg = final_config(data)
    out = [f"# mart run {md_text(data.run_id)}", "",
           f"status: {md_text(data.status)} · backend: {md_text(data.options.get('backend', '?'))} · "
           f"{len(data.trials)} trials", ""]
    out += [f"- **{md_text(a)}**: {md_text(b)}" for a, b in headline(data)]
    for key, path in data.figures.items():
        out += ["", f"![{key}]({REPORT_DIR}/{path.name})"]  # mart's own names
        if key == "best_so_far" and data.stage_trials("learning"):
            out += ["", f"*{LEARNING_PLOT_RULE}*"]  # mart's own text
    if schedule_rows(data):
        out += ["", "## Schedule (stage 3)", "", _table_md(SCHEDULE_HEADER, schedule_rows(data))]
    out += ["", "## Trials", "", _table_md(TRIAL_HEADER, trial_rows(data))]
    if data.reviews:
        out += ["", "## Reviews", "", _table_md(REVIEW_HEADER, review_rows(data))]
    if cfg:
        # code blocks show their content as is: controls stripped, and a fence the content cannot close
        overrides, yaml_text = plain(" \\\n".join(as_overrides(cfg))), plain(as_yaml(cfg).rstrip())
        f1, f2 = md_fence(overrides), md_fence(yaml_text)
        out += ["", "## Final config", "", f1, overrides, f1, "", f2 + "yaml", yaml_text, f2]
    return "\n".join(out) + "\n"


def write_report(run_dir: str | Path, fmt: str = "html", out: str | Path | None = None) -> Path:
    """Write the report of the run in ``run_dir`` (PNGs into ``run_dir/report/``); returns the page's path."""
    if fmt not in ("html", "md"):
        raise ValueError(f"report format must be 'html' or 'md', got {fmt!r}")
    run_dir = Path(run_dir)
    data = load_run(run_dir)
    data.figures = draw_figures(data, run_dir / REPORT_DIR)
    path = Path(out) if out else run_dir / f"report.{fmt}"
    text = render_html(data) if fmt == "html" else render_markdown(data)
    return write_atomic(path.parent, path.name, text)  # a reader never sees half a page; no link followed
