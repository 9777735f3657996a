"""One reader for ``KEY=VALUE`` assignments and YAML/JSON config files, and its inverse writer.

Every command that reads a config value from text uses this module: ``mart trial --set`` and
``--config``, ``mart review --edit``, the terminal and Slack edit forms, ``--backend-option`` and the
backends' ``--base-config`` files. The rules are verl's own (docs/configs.md has the table):
* ``KEY=VALUE`` is Hydra's override grammar, parsed by Hydra's own override parser, so a value means
  what it would mean on verl's command line (https://hydra.cc/docs/advanced/override_grammar/basic/):
  ``true``/``false``/``null`` in any case, ints, floats (``1e-4``, ``nan``, ``inf``), ``[a,b]`` lists,
  ``{a:1}`` dicts, ``'quoted'`` strings, and any other text as a string (``yes``, ``None``, ``0x10``).
  ``+key=`` and ``++key=`` name the same key (mart adds Hydra's ``+`` itself where verl needs it);
  deletions (``~key``), sweeps (``a,b``, ``choice(...)``) and ``@package`` are refused.
* A file is YAML (or JSON) read by OmegaConf's YAML loader, the one Hydra reads verl's own config
  files with (YAML 1.1 scalars, so ``yes`` is true and ``0x10`` is 16, but ``1e-4`` is a float), and
  holds either a mapping (nested, or flat dotted keys, or both) flattened to dotted keys, or a list of
  ``KEY=VALUE`` overrides read as above.

``format_value`` writes a typed value back in the override grammar; ``parse_value(format_value(v)) == v``.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from mart.state.files import InputFileError, read_text_capped
from mart.state.search_space import ConfigError

RULES: tuple[tuple[str, Any, Any, str], ...] = (
    # (text, as KEY=VALUE, as a YAML file's scalar, why) -- docs/configs.md shows this table and a test
    # checks both readers against it.
    ("true", True, True, "bool, any case"),
    ("yes", "yes", True, "a string in Hydra's grammar; YAML 1.1 reads it as true"),
    ("null", None, None, "null, any case"),
    ("None", "None", "None", "a string: Python's spelling means nothing to Hydra or YAML"),
    ("3", 3, 3, "int"),
    ("'3'", "3", "3", "quoted: always a string"),
    ("0x10", "0x10", 16, "a string in Hydra's grammar; YAML 1.1 reads hex"),
    ("1e-4", 1e-4, 1e-4, "float (OmegaConf's loader fixes YAML 1.1's exponent rule)"),
    ("[1,2]", [1, 2], [1, 2], "list"),
    ('["console","wandb"]', ["console", "wandb"], ["console", "wandb"], "list of strings"),
    ("low_var_kl", "low_var_kl", "low_var_kl", "any other text: a string"),
)

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_@\-]*(\.[A-Za-z0-9_@\-]+)*$")
_BARE_RE = re.compile(r"^[A-Za-z0-9_./@\-][A-Za-z0-9_./@+\-]*$")
_NUMBER_RE = re.compile(r"^[+-]?(\d[\d_]*)?(\.\d*)?([eE][+-]?\d+)?$")
_RESERVED = {"true", "false", "null", "none", "nan", "inf", "-inf", "+inf"}


def check_key(key: str) -> str:
    """Return ``key`` if it is a plain dotted config key, else raise ``ConfigError`` (no injection via keys)."""
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ConfigError(f"`{key}` is not a valid verl config key (dotted names of letters, digits, _ - @).")
    return key


@functools.lru_cache(maxsize=1)
def _hydra() -> tuple[Any, type[Exception]]:
    """Hydra's override parser and its error type, imported when a KEY=VALUE is first parsed: Hydra and OmegaConf
    cost 0.5 s and more to import, which `mart status`, `--help` and every command that parses none need not pay."""
    parser = importlib.import_module("hydra.core.override_parser.overrides_parser").OverridesParser.create()
    return parser, importlib.import_module("hydra.errors").HydraException


def parse_assignment(item: str) -> tuple[str, Any]:
    """``[+|++]KEY=VALUE`` -> ``(KEY, typed value)`` by Hydra's override grammar.

    Raises:
        ConfigError: naming the item and the rule it breaks.
    """

    text = str(item).strip()
    if text.startswith("~"):
        raise ConfigError(f"{item!r}: deletions (~KEY) are not supported; set KEY=VALUE instead.")
    if "=" not in text:
        raise ConfigError(f"expected KEY=VALUE, but got {item!r}.")
    parser, hydra_error = _hydra()
    try:
        ov = parser.parse_override(text)
    except hydra_error as e:
        reason = str(e).splitlines()[0]
        raise ConfigError(f"{item!r} is not a valid KEY=VALUE in Hydra's override grammar ({reason}); "
                          "quote a value that holds = , or spaces: KEY='a=b'.") from None
    if ov.is_sweep_override():
        raise ConfigError(f"{item!r} is a Hydra sweep, not one value; write a list as [a,b] or quote a string "
                          "as 'a,b'.")
    if ov.package is not None:
        raise ConfigError(f"{item!r}: @package is not supported; use a plain dotted KEY.")
    return check_key(ov.key_or_group), ov.value()


def parse_value(text: str) -> Any:
    """One value in Hydra's override grammar (``1e-4`` -> float, ``'3'`` -> str, ``yes`` -> str)."""
    return parse_assignment(f"k={text}")[1]


def parse_assignments(items: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` items -> ``{KEY: value}`` (a later item wins). Raises ``ConfigError``."""
    out: dict[str, Any] = {}
    for item in items:
        key, value = parse_assignment(item)
        out[key] = value
    return out


def split_assignments(text: str) -> list[str]:
    """Split a line of ``KEY=VALUE`` pairs on whitespace outside quotes and brackets.

    ``a=1 b='x y' c=[1, 2]`` -> ``["a=1", "b='x y'", "c=[1, 2]"]`` (the edit forms in a terminal and
    in Slack are one line of text).
    """
    items, buf, quote, depth = [], [], "", 0
    escaped = False
    for ch in text:
        if quote:
            buf.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch.isspace() and depth == 0:
            if buf:
                items.append("".join(buf))
                buf = []
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth = max(0, depth - 1)
        buf.append(ch)
    if buf:
        items.append("".join(buf))
    return items


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> flat dotted keys (dotted keys at any level are kept as they are)."""
    out: dict[str, Any] = {}
    for k, v in mapping.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def load_config_text(text: str, *, source: str = "config", json_only: bool = False) -> dict[str, Any]:
    """A YAML (or JSON) document -> flat ``{dotted.key: value}``; see the module docstring.

    Raises:
        ConfigError: invalid YAML/JSON, a document that is neither a mapping nor a list of overrides,
            or an invalid key; the message starts with ``source``.
    """
    if json_only:
        try:
            data = json.loads(text) if text.strip() else None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{source}: invalid JSON ({e}).") from None
    else:
        data = _load_yaml(text, source)
    if data is None:
        return {}
    if isinstance(data, list):
        try:
            flat = parse_assignments(str(item) for item in data)
        except ConfigError as e:
            raise ConfigError(f"{source}: a list must hold KEY=VALUE overrides: {e}") from None
    elif isinstance(data, Mapping):
        flat = flatten(data)
    else:
        raise ConfigError(f"{source} must hold a mapping of KEY: VALUE or a list of KEY=VALUE overrides, "
                          "not a single value.")
    for key in flat:
        try:
            check_key(key)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
    return flat


#: a base config is a few KB (verl's whole config has about a thousand keys)
MAX_CONFIG_BYTES = 1 << 20


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML or JSON file (``.json`` is read as strict JSON) -> flat ``{dotted.key: value}``.

    Raises:
        ConfigError: the file cannot be read or parsed, or has the wrong shape (names the file).
    """

    path = Path(path)
    try:
        text = read_text_capped(path, MAX_CONFIG_BYTES, "config file")  # a regular file, a few KB
    except InputFileError as e:
        raise ConfigError(f"{e}.") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {str(path)!r}: {e.strerror or e}.") from None
    return load_config_text(text, source=f"config file {str(path)!r}", json_only=path.suffix.lower() == ".json")


def _load_yaml(text: str, source: str) -> Any:
    # OmegaConf reads YAML with the loader Hydra reads verl's configs with (and refuses duplicate
    # keys); to_container(resolve=False) keeps ${...} interpolations as text for verl. It turns a bare
    # scalar document into {scalar: None}, so the document's shape is checked first.

    try:
        shape = yaml.load(text, Loader=yaml.BaseLoader)  # strings only: the shape, no value rules
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: invalid YAML ({e}).") from None
    if shape is None or not isinstance(shape, (dict, list)):
        return shape
    omegaconf = importlib.import_module("omegaconf")  # where it is used: see _hydra
    try:
        return omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.create(text), resolve=False)
    except (yaml.YAMLError, omegaconf.errors.OmegaConfBaseException, ValueError) as e:
        raise ConfigError(f"{source}: invalid YAML ({e}).") from None


def format_value(value: Any) -> str:
    """Write a typed value in Hydra's override grammar (the inverse of ``parse_value``).

    bool -> ``true``/``false``; None -> ``null``; numbers as Python writes them; lists ``[a,b]``;
    dicts ``{k:v}``; strings bare when Hydra reads them back as the same string, else single-quoted
    with ``\\`` escapes.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{check_key(str(k))}:{format_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if text and _BARE_RE.match(text) and text.lower() not in _RESERVED and not _NUMBER_RE.match(text):
        return text
    return "'" + _QUOTE_ESCAPE.sub(_escape_run, text) + "'"


# In Hydra's quoted strings a backslash escapes only what comes right before a quote (the quote itself, and the
# backslashes before it) or before the closing quote; any other backslash is a literal one
# (https://hydra.cc/docs/advanced/override_grammar/basic/#escaped-characters-in-quoted-values).
_QUOTE_ESCAPE = re.compile(r"(\\*)('|$)")


def _escape_run(m: re.Match) -> str:
    return m.group(1) * 2 + ("\\'" if m.group(2) else "")
