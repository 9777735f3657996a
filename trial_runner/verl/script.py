"""Read a verl run script (``run_qwen3_8b.sh``) into a base config: ``mart import-verl SCRIPT.sh``.

A typical script sets shell variables and then runs ``python3 -m verl.trainer.main_ppo key=value ... "$@"``
over many continued lines. This module reads that command the way bash would for the common cases:

* line continuations (``\\`` + newline), comments, single and double quotes, backslash escapes;
* ``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:=default}`` from the script's own
  assignments (``VAR=...``, ``export VAR=...``, in order) and then the environment;
* ``"$@"`` (the script passes its arguments on: mart's overrides reach verl through it);
* values in Hydra's grammar, lists included (``trainer.logger='["console","wandb"]'`` -> a list).

What it cannot evaluate - command substitution ``$(...)``, arithmetic, unset variables without a default,
control flow around the command - is reported in ``unresolved`` (and the key is left out), never guessed.
It does not run the script.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mart.state.config_values import check_key, parse_value
from mart.state.search_space import ConfigError

_ASSIGN_RE = re.compile(r"^(?:export\s+|local\s+|declare\s+(?:-\w+\s+)?)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENTRY_RE = re.compile(r"(?:^|[/.])main_ppo(?:\.py)?$")
_OPERATORS = ("&&", "||", ";", "|", "&")
ARGS = "\0ARGS\0"  # the word "$@" / "$*"


class _Unresolved(Exception):
    pass


@dataclass
class ScriptImport:
    """The verl command found in a script: its overrides (typed), what could not be resolved, and more."""

    overrides: dict[str, Any] = field(default_factory=dict)
    unresolved: list[str] = field(default_factory=list)
    passes_args: bool = False
    launcher: list[str] = field(default_factory=list)
    variables: dict[str, str] = field(default_factory=dict)
    line: int | None = None
    unresolved_keys: set[str] = field(default_factory=set)

    def report(self) -> str:
        """Human-readable summary of the import (what was found, what was not)."""
        args = 'passed on ("$@")' if self.passes_args else 'NOT passed on (no "$@")'
        lines = [f"found the verl command on line {self.line}: {' '.join(self.launcher)} "
                 f"({len(self.overrides)} overrides; script arguments {args})"]
        lines += [f"could not resolve: {u}" for u in self.unresolved]
        hint = self.python_hint()
        if hint:
            lines.append(hint)
        return "\n".join(lines)

    def python_hint(self) -> str | None:
        """The script runs verl with an interpreter of its own: say how mart runs the same one."""
        exe = self.launcher[0] if self.launcher else ""
        if os.path.basename(exe).startswith("python") and exe not in ("python", "python3"):
            return f"the script runs verl with {exe}: give mart the same with --verl-python {exe}"
        return None


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with continuations joined, each with its first physical line number."""
    out: list[tuple[int, str]] = []
    buf, start = "", 1
    for no, raw in enumerate(text.splitlines(), 1):
        if not buf:
            start = no
        stripped = raw.rstrip()
        if stripped.endswith("\\") and not stripped.endswith("\\\\"):
            buf += stripped[:-1] + " "
            continue
        buf += raw
        out.append((start, buf))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


class _Words:
    """A small bash word splitter with parameter expansion (no globbing, no command substitution)."""

    def __init__(self, lookup, line_no: int) -> None:
        self.lookup = lookup
        self.line_no = line_no

    def split(self, text: str) -> list[tuple[str, list[str]]]:
        """Words of ``text`` as (value, problems); operators are words of their own; stops at a comment."""
        words: list[tuple[str, list[str]]] = []
        cur: list[str] = []
        problems: list[str] = []
        started = False
        i, n = 0, len(text)
        while i < n:
            c = text[i]
            if c in " \t\n":
                if started:
                    words.append(("".join(cur), problems))
                    cur, problems, started = [], [], False
                i += 1
                continue
            if c == "#" and not started:
                break
            two = text[i:i + 2]
            if not started and (two in ("&&", "||") or c in ";|&"):
                op = two if two in ("&&", "||") else c
                words.append((op, []))
                i += len(op)
                continue
            started = True
            if c == "\\" and i + 1 < n:
                cur.append(text[i + 1])
                i += 2
            elif c == "'":
                j = text.find("'", i + 1)
                j = n if j < 0 else j
                cur.append(text[i + 1:j])
                i = j + 1
            elif c == '"':
                i = self._double(text, i + 1, cur, problems)
            elif c == "$":
                i = self._dollar(text, i, cur, problems, quoted=False)
            elif c == "`":
                i = self._backtick(text, i, problems)
            else:
                cur.append(c)
                i += 1
        if started:
            words.append(("".join(cur), problems))
        return words

    @staticmethod
    def _backtick(text: str, i: int, problems: list[str]) -> int:
        """A `...` command substitution cannot be resolved statically: note it, skip past it."""
        j = text.find("`", i + 1)
        problems.append(f"command substitution `{text[i + 1:j if j > 0 else len(text)]}`")
        return (j + 1) if j > 0 else len(text)

    def _double(self, text: str, i: int, cur: list[str], problems: list[str]) -> int:
        n = len(text)
        while i < n and text[i] != '"':
            c = text[i]
            if c == "\\" and i + 1 < n and text[i + 1] in '$`"\\\n':
                cur.append(text[i + 1])
                i += 2
            elif c == "$":
                i = self._dollar(text, i, cur, problems, quoted=True)
            elif c == "`":
                i = self._backtick(text, i, problems)
            else:
                cur.append(c)
                i += 1
        return i + 1

    def _dollar(self, text: str, i: int, cur: list[str], problems: list[str], quoted: bool) -> int:
        n = len(text)
        nxt = text[i + 1] if i + 1 < n else ""
        if nxt in ("@", "*"):
            cur.append(ARGS)
            return i + 2
        if nxt == "(":
            depth, j = 0, i + 1
            while j < n:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                if depth == 0:
                    break
                j += 1
            problems.append(f"command substitution {text[i:j + 1]}")
            return j + 1
        if nxt == "{":
            j = text.find("}", i + 2)
            if j < 0:
                problems.append(f"unterminated {text[i:]}")
                return n
            cur.append(self._braced(text[i + 2:j], problems))
            return j + 1
        m = _NAME_RE.match(text, i + 1)
        if m:
            cur.append(self._value(m.group(0), None, problems))
            return m.end()
        if nxt.isdigit():
            problems.append(f"positional parameter ${nxt}")
            return i + 2
        cur.append("$")
        return i + 1

    def _braced(self, body: str, problems: list[str]) -> str:
        m = _NAME_RE.match(body)
        if not m:
            problems.append(f"${{{body}}}")
            return ""
        name, rest = m.group(0), body[m.end():]
        if not rest:
            return self._value(name, None, problems)
        for op in (":-", ":=", "-", "="):
            if rest.startswith(op):
                default = rest[len(op):]
                # the default is itself a word (it may hold $VARs and quotes)
                sub = _Words(self.lookup, self.line_no).split(default)
                for _, p in sub:
                    problems.extend(p)
                default_val = " ".join(w for w, _ in sub)
                value = self.lookup(name)
                if value is None or (op.startswith(":") and value == ""):
                    return default_val
                return value
        problems.append(f"${{{body}}} (unsupported expansion)")
        return ""

    def _value(self, name: str, default: str | None, problems: list[str]) -> str:
        value = self.lookup(name)
        if value is None:
            why = self.lookup.unknown.get(name) if hasattr(self.lookup, "unknown") else None
            problems.append(f"${name} {why or 'is not set in the script or the environment'}")
            return ""
        return value


def import_run_script(text: str, env: Mapping[str, str] | None = None) -> ScriptImport:
    """Parse a run script's text (see the module docstring); ``env`` defaults to ``os.environ``.

    Raises:
        ConfigError: no ``verl.trainer.main_ppo`` command in the script.
    """
    env = dict(os.environ if env is None else env)
    variables: dict[str, str] = {}
    unknown: dict[str, str] = {}

    def lookup(name: str) -> str | None:
        return variables.get(name, env.get(name))

    lookup.unknown = unknown  # type: ignore[attr-defined]  # why a variable has no value

    result: ScriptImport | None = None
    for line_no, line in _logical_lines(text):
        words = _Words(lookup, line_no).split(line)
        if not words:
            continue
        # a plain assignment line: NAME=value (value expanded with what is known so far)
        raw = line.strip()
        m = _ASSIGN_RE.match(raw)
        if m and len(words) == 1 + (1 if raw.split(None, 1)[0] in ("export", "local", "declare") else 0):
            value, problems = words[-1]
            name = m.group(1)
            val = value.partition("=")[2]
            if problems:
                # remember that it is unknown: a later $NAME is then reported, not guessed
                variables.pop(name, None)
                env.pop(name, None)
                unknown[name] = f"(its assignment on line {line_no} needs {', '.join(problems)})"
                continue
            unknown.pop(name, None)
            variables[name] = val
            continue
        idx = next((k for k, (w, _) in enumerate(words) if _ENTRY_RE.search(w)), None)
        if idx is None or result is not None:
            continue
        result = ScriptImport(line=line_no, variables=dict(variables))
        result.launcher = [w for w, _ in words[:idx + 1] if not _ASSIGN_RE.match(w)]
        for word, problems in words[idx + 1:]:
            if word in _OPERATORS:
                break  # `| tee log`, `; echo done`: the rest is not verl's
            if re.match(r"^\d*[<>]", word):
                continue  # a redirection (2>&1, >log)
            if ARGS in word:
                result.passes_args = True
                continue
            if word.startswith("-"):
                result.unresolved.append(f"line {line_no}: option {word!r} is not a key=value override (ignored)")
                continue
            body = word.lstrip("+")
            key, sep, value = body.partition("=")
            if not sep:
                result.unresolved.append(f"line {line_no}: {word!r} is not a key=value override (ignored)")
                continue
            if problems:
                result.unresolved.append(f"{key}: {', '.join(problems)} (line {line_no}; left out)")
                result.unresolved_keys.add(key)
                continue
            try:
                result.overrides[check_key(key)] = parse_value(value)
            except ConfigError as e:
                result.unresolved.append(f"line {line_no}: {e}")
    if result is None:
        raise ConfigError("no `verl.trainer.main_ppo` command found in the script (mart reads the overrides "
                          "of `python3 -m verl.trainer.main_ppo key=value ...`).")
    return result


def import_run_script_file(path: str | os.PathLike, env: Mapping[str, str] | None = None) -> ScriptImport:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"run script {str(path)!r}: cannot read it ({e}).") from e
    return import_run_script(text, env)


def script_in_entrypoint(argv: list[str]) -> str | None:
    """The run script an entrypoint runs (``bash run.sh``, ``./run.sh``), or None."""
    for tok in argv[:3]:
        if tok.endswith(".sh") and os.path.isfile(tok):
            return tok
    return None


def to_yaml(overrides: Mapping[str, Any], header: str = "") -> str:
    """A base-config YAML (flat keys, the script's order) that ``--base-config`` reads back unchanged."""
    import yaml

    def flow(value: Any) -> str:  # one line per key; lists and mappings in flow style ([a, b])
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
        return text[:-3].strip() if text.endswith("\n...") or text == "..." else text

    body = "".join(f"{flow(k)}: {flow(v)}\n" for k, v in overrides.items())
    return header + body
