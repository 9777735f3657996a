"""Foreign text (trial logs, LLM answers, reviewer feedback, a run folder's ledger) made safe for each output.

One helper per kind of output, used for every foreign string that reaches it:

* ``plain`` - a terminal (progress lines, ``mart trials``/``status``, the review, logs): no C0/C1 control
  characters (ESC starts sequences that clear the screen, set the window title, draw hyperlinks; U+009B is a
  one-character CSI on many terminals), no bidirectional overrides (CVE-2021-42574, "Trojan Source",
  https://nvd.nist.gov/vuln/detail/CVE-2021-42574); newlines and tabs kept. ``one_line`` also folds newlines,
  for a line that must stay one line.
* ``html_text`` - HTML (the report page): ``plain`` and HTML-escaped.
* ``md_text`` - Markdown (``mart report --format md``): ``html_text`` and CommonMark's punctuation
  backslash-escaped (https://spec.commonmark.org/0.31.2/#backslash-escapes), so ``<img ...>``,
  ``![](url)`` and ``[x](javascript:...)`` render as the text they are. ``md_fence`` opens a code block that
  the content cannot close.
* ``slack_text`` - Slack mrkdwn: ``plain`` and ``&<>`` escaped as Slack asks
  (https://api.slack.com/reference/surfaces/formatting#escaping), so ``<!channel>`` or ``<https://evil|docs>``
  show as text (no mention, no disguised link).
"""

from __future__ import annotations

import html
import re
from typing import Any

_BIDI = dict.fromkeys(map(ord, "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"))
_CONTROLS = {c: None for c in [*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f, *range(0x80, 0xa0)]}
_STRIP = {**_CONTROLS, **_BIDI, 0x0d: None}
_MD_PUNCT = re.compile(r"([\\`*_{}\[\]()#+!|~])")


def plain(text: Any) -> str:
    """``text`` without control characters and bidi overrides (newlines and tabs kept)."""
    return str(text).translate(_STRIP)


def one_line(text: Any) -> str:
    """``plain`` on one line (newlines and runs of spaces folded to one space)."""
    return " ".join(plain(text).split())


def html_text(text: Any) -> str:
    """Text for an HTML page: ``plain``, then HTML-escaped (quotes included)."""
    return html.escape(plain(text))


def md_text(text: Any) -> str:
    """Text for Markdown: no raw HTML, no link or image syntax, no emphasis, on one line."""
    return _MD_PUNCT.sub(r"\\\1", html.escape(one_line(text), quote=False))


def md_fence(content: str) -> str:
    """A backtick fence longer than any backtick run in ``content`` (so the content cannot end the block)."""
    longest = max((len(m) for m in re.findall(r"`+", content)), default=0)
    return "`" * max(3, longest + 1)


def slack_text(text: Any) -> str:
    """Text for a Slack mrkdwn field: ``plain``, ``&<>`` escaped."""
    return plain(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


__all__ = ["html_text", "md_fence", "md_text", "one_line", "plain", "slack_text"]
