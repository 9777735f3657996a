"""Read a verl run script (``run_qwen3_8b.sh``) into a base config: ``mart import-verl SCRIPT.sh``.

A typical script sets shell variables and then runs ``python3 -m verl.trainer.main_ppo key=value ... "$@"``;
verl's own examples (0.8 and 0.9) build that command from bash arrays (``DATA=(...)``, ``"${DATA[@]}"``).
This module reads the command the way bash would for the common cases, without running anything:

* line continuations (``\\`` + newline), comments, single and double quotes, backslash escapes;
* arrays: ``NAME=(...)`` over several lines, ``NAME+=(...)``, ``"${NAME[@]}"`` / ``${NAME[*]}`` as words,
  ``${NAME[i]}`` (``LAUNCH=(python3 -m verl.trainer.main_ppo)`` then ``"${LAUNCH[@]}" ...`` too);
* ``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:=default}`` (defaults nest) from the
  script's own assignments, in order; here-documents are skipped; ``"$@"`` (the script passes its arguments
  on: mart's overrides reach verl through it);
* values in Hydra's grammar, lists included (``trainer.logger='["console","wandb"]'`` -> a list).

mart's own environment is never expanded into a value (it holds API keys and tokens): ``$HOME`` that the
script does not set is kept as ``${oc.env:HOME}``, which verl (OmegaConf) resolves in the trial's environment,
and ``${VAR:-default}`` takes the script's default (the report names the variables your environment sets).
Assignments inside ``if``/``case``/loops run only on some branches: they are named in the report and not
taken. What it cannot evaluate - command substitution ``$(...)``, arithmetic, unset variables without a
default - is reported in ``unresolved`` (and the key is left out), never guessed. A script must be a regular
text file of at most ``MAX_SCRIPT_BYTES`` with at most ``MAX_OVERRIDES`` overrides.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mart.state.config_values import check_key, parse_value
from mart.state.search_space import ConfigError

#: a verl run script is a few KB; verl's whole config has about a thousand keys
MAX_SCRIPT_BYTES = 1 << 20
MAX_OVERRIDES = 5000

_PREFIX = r"(?:export\s+|local\s+|readonly\s+|declare\s+(?:-\w+\s+)*)?"
_ASSIGN_RE = re.compile(r"^" + _PREFIX + r"([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_ARRAY_RE = re.compile(r"^\s*" + _PREFIX + r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=\((.*)\)\s*(?:#[^\n]*)?$", re.S)
_ARRAY_START_RE = re.compile(r"^\s*" + _PREFIX + r"[A-Za-z_][A-Za-z0-9_]*\+?=\(")
_ARRAY_WORD_RE = re.compile(r'"?\$\{([A-Za-z_][A-Za-z0-9_]*)\[([@*])\]\}"?(?=$|[\s;&|])')
_HEREDOC_RE = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_REF_RE = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)\}")
_ENTRY_RE = re.compile(r"(?:^|[/.])main_ppo(?:\.py)?$")
_OPERATORS = ("&&", "||", ";", "|", "&")
_OPENS = {"if": "if", "case": "case", "for": "loop", "while": "loop", "until": "loop", "select": "loop"}
_CLOSES = ("fi", "esac", "done")
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
    notes: list[str] = field(default_factory=list)
    """What the reader decided that the user should know (names only, never a value of the environment)."""

    def report(self) -> str:
        """Human-readable summary of the import (what was found, what was not)."""
        args = 'passed on ("$@")' if self.passes_args else 'NOT passed on (no "$@")'
        lines = [f"found the verl command on line {self.line}: {' '.join(self.launcher)} "
                 f"({len(self.overrides)} overrides; script arguments {args})"]
        lines += [f"could not resolve: {u}" for u in self.unresolved]
        lines += [f"note: {n}" for n in self.notes]
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


def _array_open(buf: str) -> bool:
    """Whether ``buf`` starts an array assignment whose ``)`` has not come yet (quotes and comments skipped)."""
    m = _ARRAY_START_RE.match(buf)
    if not m:
        return False
    depth, i, n, quote = 1, m.end(), len(buf), ""
    while i < n:
        c = buf[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
        elif c == "#" and (i == 0 or buf[i - 1] in " \t\n("):
            j = buf.find("\n", i)
            i = n if j < 0 else j
            continue
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return False
        i += 1
    return True


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with continuations joined and multi-line arrays gathered, each with its first line number;
    here-document bodies are left out."""
    out: list[tuple[int, str]] = []
    lines = text.splitlines()
    i, n = 0, len(lines)
    while i < n:
        start, buf = i + 1, ""
        while i < n:
            raw = lines[i]
            i += 1
            stripped = raw.rstrip()
            if stripped.endswith("\\") and not stripped.endswith("\\\\") and i < n:
                buf += stripped[:-1] + " "
                continue
            buf += raw
            if i < n and _array_open(buf):
                buf += "\n"
                continue
            break
        out.append((start, buf))
        here = _HEREDOC_RE.search(buf)
        if here:
            strip_tabs, delim = here.group(1) == "-", here.group(3)
            while i < n and (lines[i].lstrip("\t") if strip_tabs else lines[i]) != delim:
                i += 1
            i += 1  # the delimiter line
    return out


class _Vars:
    """What words may read: the script's own variables and arrays; of the environment only which names it sets."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.scalars: dict[str, str] = {}
        self.arrays: dict[str, list[tuple[str, list[str]]]] = {}
        self.unknown: dict[str, str] = {}
        self.env_refs: set[str] = set()
        self.env_defaults: set[str] = set()

    def get(self, name: str) -> str | None:
        if name in self.scalars:
            return self.scalars[name]
        if name in self.arrays:  # $NAME of an array is its first element
            elems = self.arrays[name]
            return elems[0][0] if elems and not elems[0][1] else None
        return None


def _close_brace(text: str, i: int) -> int:
    """Index of the ``}`` that closes the ``${`` whose body starts at ``i`` (nested ``${...}`` skipped), or -1."""
    depth = 1
    while i < len(text):
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


class _Words:
    """A small bash word splitter with parameter expansion (no globbing, no command substitution)."""

    def __init__(self, vars: _Vars, line_no: int) -> None:
        self.vars = vars
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
            if not started:
                m = _ARRAY_WORD_RE.match(text, i)
                if m and (m.group(0).startswith('"') == m.group(0).endswith('"')):
                    words.extend(self._array_words(m.group(1)))
                    i = m.end()
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

    def _array_words(self, name: str) -> list[tuple[str, list[str]]]:
        if name in self.vars.arrays:
            return [(w, list(p)) for w, p in self.vars.arrays[name]]
        why = self.vars.unknown.get(name) or "is not set in the script"
        return [("", [f"array ${{{name}[@]}} {why}"])]

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
            j = _close_brace(text, i + 2)
            if j < 0:
                problems.append(f"unterminated {text[i:]}")
                return n
            cur.append(self._braced(text[i + 2:j], problems))
            return j + 1
        m = _NAME_RE.match(text, i + 1)
        if m:
            cur.append(self._value(m.group(0), problems))
            return m.end()
        if nxt.isdigit() or nxt in "#?$!-":
            problems.append(f"shell parameter ${nxt}")
            return i + 2
        cur.append("$")
        return i + 1

    def _braced(self, body: str, problems: list[str]) -> str:
        m = _NAME_RE.match(body)
        if not m:
            problems.append(f"${{{body}}} (unsupported expansion)")
            return ""
        name, rest = m.group(0), body[m.end():]
        index = re.match(r"\[(\d+|@|\*)\]", rest)
        if index:  # ${NAME[i]}, or ${NAME[@]} inside a longer word (joined with spaces, as bash does)
            rest = rest[index.end():]
            if rest:
                problems.append(f"${{{body}}} (unsupported expansion)")
                return ""
            elems = self._array_words(name)
            if index.group(1) in "@*":
                for _, p in elems:
                    problems.extend(p)
                return " ".join(w for w, _ in elems)
            k = int(index.group(1))
            if k >= len(elems):
                problems.append(f"${{{body}}}: the array has no element {k}")
                return ""
            problems.extend(elems[k][1])
            return elems[k][0]
        if not rest:
            return self._value(name, problems)
        for op in (":-", ":=", "-", "="):
            if rest.startswith(op):
                # the default is itself a word (it may hold $VARs and quotes)
                sub = _Words(self.vars, self.line_no).split(rest[len(op):])
                for _, p in sub:
                    problems.extend(p)
                default_val = " ".join(w for w, _ in sub)
                value = self.vars.get(name)
                if value is None or (op.startswith(":") and value == ""):
                    if name not in self.vars.scalars and name in self.vars.env:
                        self.vars.env_defaults.add(name)  # the script's default: the environment is not read
                    if op.endswith("="):
                        self.vars.scalars[name] = default_val
                    return default_val
                return value
        problems.append(f"${{{body}}} (unsupported expansion)")
        return ""

    def _value(self, name: str, problems: list[str]) -> str:
        value = self.vars.get(name)
        if value is not None:
            return value
        if name in self.vars.unknown:
            problems.append(f"${name} {self.vars.unknown[name]}")
            return ""
        if name in self.vars.env:
            # never the value: verl resolves the reference in the trial's own environment
            self.vars.env_refs.add(name)
            return f"${{oc.env:{name}}}"
        problems.append(f"${name} is not set in the script or the environment")
        return ""


def _block_change(first: str, words: list[str], depth: list[tuple[str, int]], line_no: int) -> None:
    """Track if/case/loop/function blocks by their opening and closing words."""
    if first in _OPENS and not (words and words[-1] in _CLOSES):
        depth.append((_OPENS[first], line_no))
    elif first in _CLOSES or first == "}":
        if depth:
            depth.pop()
    elif first == "function" or re.match(r"^[A-Za-z_][\w-]*\s*\(\)\s*\{?$", " ".join(words[:3])):
        depth.append(("function", line_no))


def import_run_script(text: str, env: Mapping[str, str] | None = None) -> ScriptImport:
    """Parse a run script's text (see the module docstring); ``env`` defaults to ``os.environ`` (only which
    names it sets is read, never a value, except to find the verl command's own words).

    Raises:
        ConfigError: no ``verl.trainer.main_ppo`` command in the script, or a script over the limits.
    """
    if len(text) > MAX_SCRIPT_BYTES:
        raise ConfigError(f"the run script is {len(text)} characters long, over the limit of {MAX_SCRIPT_BYTES} "
                          "(a verl run script is a few KB): give the script that launches verl")
    env = os.environ if env is None else env
    vars = _Vars(env)
    blocks: list[tuple[str, int]] = []
    pending: list[str] = []  # notes of the lines before the verl command (moved onto its ScriptImport)
    result: ScriptImport | None = None
    for line_no, line in _logical_lines(text):
        raw = line.strip()
        first = raw.split(None, 1)[0] if raw else ""
        if first.startswith("#") or not raw:
            continue
        conditional = blocks[-1] if blocks else None
        arr = _ARRAY_RE.match(raw)
        if arr:
            name, append, inner = arr.group(1), arr.group(2) == "+", arr.group(3)
            elems = [w for part in inner.split("\n") for w in _Words(vars, line_no).split(part)]
            if conditional:
                what = "function" if conditional[0] == "function" else f"`{conditional[0]}` block"
                result_note = (f"{name}{'+' if append else ''}=(...) on line {line_no} is inside the {what} "
                               f"of line {conditional[1]} (it runs only on some branches): not imported")
                (result.notes if result else pending).append(result_note)
                continue
            vars.arrays[name] = (vars.arrays.get(name, []) if append else []) + elems
            vars.scalars.pop(name, None)
            vars.unknown.pop(name, None)
            continue
        words = _Words(vars, line_no).split(line)
        if not words:
            continue
        plain_words = [w for w, _ in words]
        if first == "unset":
            for name in plain_words[1:]:
                vars.scalars.pop(name, None)
                vars.arrays.pop(name, None)
                vars.unknown[name] = f"(unset on line {line_no})"
            continue
        # a plain assignment line: NAME=value (value expanded with what is known so far)
        m = _ASSIGN_RE.match(raw)
        prefix_words = 1 if first in ("export", "local", "declare", "readonly") else 0
        if m and len(words) == 1 + prefix_words:
            value, problems = words[-1]
            name = m.group(1)
            if conditional:
                what = "function" if conditional[0] == "function" else f"`{conditional[0]}` block"
                note = (f"{name} is set on line {line_no} inside the {what} of line {conditional[1]} (only on "
                        "some branches): not imported" + ("; the value set before it is used"
                                                          if vars.get(name) is not None else ""))
                (result.notes if result else pending).append(note)
                if vars.get(name) is None:
                    vars.unknown[name] = f"(set only inside the {what} of line {conditional[1]})"
                continue
            if problems:
                # remember that it is unknown: a later $NAME is then reported, not guessed
                vars.scalars.pop(name, None)
                vars.unknown[name] = f"(its assignment on line {line_no} needs {', '.join(problems)})"
                continue
            vars.unknown.pop(name, None)
            vars.arrays.pop(name, None)
            vars.scalars[name] = value.partition("=")[2]
            continue
        _block_change(first, plain_words, blocks, line_no)
        # the verl command's own words may name the interpreter from the environment ($PY_BIN): read there only
        expanded = [_ENV_REF_RE.sub(lambda r: env.get(r.group(1), ""), w) for w in plain_words]
        idx = next((k for k, w in enumerate(expanded) if _ENTRY_RE.search(w)), None)
        if idx is None or result is not None:
            continue
        result = ScriptImport(line=line_no, variables=dict(vars.scalars))
        result.notes.extend(pending)
        result.launcher = [w for w in expanded[:idx + 1] if not _ASSIGN_RE.match(w)]
        rest = words[idx + 1:]
        candidates = sum(1 for w, _ in rest if "=" in w and not w.startswith("-"))
        if candidates > MAX_OVERRIDES:
            raise ConfigError(f"the verl command on line {line_no} has {candidates} overrides, over the limit of "
                              f"{MAX_OVERRIDES} (verl's whole config has about a thousand keys)")
        for word, problems in rest:
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
                if word or not problems:
                    result.unresolved.append(f"line {line_no}: {word!r} is not a key=value override (ignored)")
                else:
                    result.unresolved.append(f"line {line_no}: {', '.join(problems)} (left out)")
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
    if vars.env_refs:
        result.notes.append("kept as references that verl resolves in the trial's environment (mart never copies "
                            "a value of its own environment): " + ", ".join(f"${n}" for n in sorted(vars.env_refs)))
    if vars.env_defaults:
        result.notes.append("set in your environment but not read (the script's defaults are used; edit the "
                            "config, or write ${oc.env:NAME}): " + ", ".join(sorted(vars.env_defaults)))
    return result


def import_run_script_file(path: str | os.PathLike, env: Mapping[str, str] | None = None) -> ScriptImport:
    """``import_run_script`` of a file: a regular text file of at most ``MAX_SCRIPT_BYTES``.

    Raises:
        ConfigError: not a regular file, unreadable, binary or too large (one line naming the file), or as above.
    """
    from mart.state.files import InputFileError, read_text_capped

    name = str(path)
    try:
        text = read_text_capped(path, MAX_SCRIPT_BYTES, "run script")
    except InputFileError as e:
        raise ConfigError(f"{e}; give the bash script that runs verl") from None
    except OSError as e:
        raise ConfigError(f"run script {name!r}: cannot read it ({e.strerror or e}).") from None
    try:
        return import_run_script(text, env)
    except ConfigError as e:
        raise ConfigError(f"run script {name!r}: {e}") from None


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
