"""Command-line options generated from a pydantic model, so the model is their one source.

Each field becomes one typer option with the field's name (``--system-trials``), type, default and
description, the way TRL builds its command lines from its config dataclasses
(https://huggingface.co/docs/trl/main/en/clis). Constraints (``ge=1``) are shown in the help and
checked by the model itself, so a flag and the Python API refuse the same values with the same rule.
"""

from __future__ import annotations

import enum
import functools
import inspect
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo

_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def model_options(model: type[BaseModel], *, exclude: Iterable[str] = (),
                  aliases: Mapping[str, Iterable[str]] | None = None, into: str = "options",
                  own_first: bool = False) -> Callable:
    """Decorator: give a typer command one option per field of ``model``.

    The decorated function declares its own command-line-only parameters as usual plus a parameter
    named ``into``; it receives ``{field: value}`` there (every field but ``exclude``, defaults filled
    in). ``aliases`` adds flag spellings per field (``{"memory_margin": ["--margin"]}``). The generated
    options come first in ``--help``, or after the command's own with ``own_first``.
    """
    aliases = dict(aliases or {})
    generated = {name: field for name, field in model.model_fields.items() if name not in set(exclude)}
    unknown = sorted(set(aliases) - set(generated))
    if unknown:
        raise ValueError(f"aliases for fields that {model.__name__} lacks: {unknown}")
    converters: dict[str, Callable[[Any], Any]] = {}
    params = []
    for name, field in generated.items():
        param, convert = _parameter(name, field, list(aliases.get(name, ())))
        params.append(param)
        if convert is not None:
            converters[name] = convert

    def decorate(func: Callable) -> Callable:
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
               for p in inspect.signature(func).parameters.values() if p.name != into]
        clash = sorted({p.name for p in own} & set(generated))
        if clash:
            raise ValueError(f"{func.__name__} declares {clash}, which {model.__name__} generates")

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            values = {}
            for name in generated:
                value = kwargs.pop(name)
                values[name] = converters[name](value) if name in converters and value is not None else value
            return func(**kwargs, **{into: values})

        # typer reads the parameters (and their order in --help) from __signature__
        command.__signature__ = inspect.Signature(own + params if own_first else params + own)  # type: ignore[attr-defined]
        return command

    return decorate


def flag_names(model: type[BaseModel], aliases: Mapping[str, Iterable[str]] | None = None) -> dict[str, str]:
    """``{field: "--flag[, --alias]"}``: how a field is spelled on the command line (for error messages)."""
    aliases = dict(aliases or {})
    return {name: ", ".join([*aliases.get(name, ()), _flag(name)]) for name in model.model_fields}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parameter(name: str, field: FieldInfo, extra: list[str]) -> tuple[inspect.Parameter, Callable | None]:
    annotation, optional = _strip_none(field.annotation)
    convert: Callable | None = None
    metavar = None
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        # an Enum, not Literal: typer shows and checks the choices for it in every supported version
        values = typing.get_args(annotation)
        choices = enum.Enum(f"{name}_choices", {str(v): str(v) for v in values}, type=str)  # type: ignore[misc]
        py_type: Any = choices
        convert = _enum_value
    elif origin is list and (field.json_schema_extra or {}).get("repeatable"):
        py_type = list[str]  # given once per value (--backend-option A=1 --backend-option B=2): a value may hold commas
    elif origin in (tuple, list):
        items = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        extra_schema = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if "metavar" in extra_schema:  # a list whose items the model checks against a registry (stages)
            metavar = str(extra_schema["metavar"])
        elif origin is list and items and typing.get_origin(items[0]) is typing.Literal:
            metavar = "|".join(map(str, typing.get_args(items[0]))) + ",..."  # list[Literal[...]]: the choices
        else:
            metavar = ",".join(getattr(a, "__name__", "X").upper() for a in items) or "A,B"
        py_type, convert = str, _split_commas  # the model converts and checks the items (tuple[float, float])
    elif annotation in (int, float, str, bool):
        py_type = annotation
    else:
        raise TypeError(f"no command-line option for field {name!r} of type {field.annotation!r}")
    default = field.get_default(call_default_factory=True)
    if py_type is str and isinstance(default, (list, tuple)):
        default = ",".join(map(str, default))  # the flag's text form, split again like a typed value
    if isinstance(py_type, type) and issubclass(py_type, enum.Enum) and default is not None:
        default = py_type(str(default))
    flag = _flag(name)
    if py_type is bool and default is True:  # a flag that is on by default needs its off switch
        flag = f"{flag}/--no-{flag[2:]}"
    # a kept older spelling first: it is the one README and scripts use
    option = typer.Option(default, *extra, flag, help=_help(field), metavar=metavar,
                          show_default=default is not None)
    annotation = Optional[py_type] if optional else py_type
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation), convert


def _strip_none(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _help(field: FieldInfo) -> str:
    text = (field.description or "").rstrip()
    bounds = [f"{sign} {getattr(m, attr)}" for m in field.metadata for attr, sign in _BOUNDS
              if getattr(m, attr, None) is not None]
    return f"{text} ({', '.join(bounds)})" if bounds else text


def _enum_value(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _split_commas(value: str) -> list[str]:
    return [part.strip() for part in str(value).split(",")]
