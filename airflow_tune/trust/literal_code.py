"""Which import paths the DAG file wrote in a code position: the only strings that license code (besides the
deployment's allow-list, :mod:`airflow_tune.trust.code`).

An operator argument is read as the DAG file gives it, before any rendering, with the spec's own grammar of code
(:func:`airflow_tune.common.spec.trust.field_code_references`): the trainable; a ``sample_from`` in the space (nested,
in a ``choice`` or a ``grid_search``) or in PBT's mutations; a scheduler's or searcher's ``factory``; a callback's class
path or factory. The same string anywhere else (a ``choice`` of model names, a logger's argument, a parameter that
happens to be called ``factory``) is data and licenses nothing, so a conf cannot promote it to code.

An argument is a Python value or a string (JSON or a Python literal, as
:func:`airflow_tune.trust.rendered.coerce_rendered` reads it), and either may hold templates, whose text is data: a
string with a template in it is never a path, and a
JSON or Python-literal string is read with each template (and each quoted string a template is part of) standing for
an opaque string, so the literal text around it keeps its place. Text that reads as no value so replaced (a template
that writes structure, such as ``{% if %}`` around keys) licenses nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_tune.common.spec import IMPORT_PATH
from airflow_tune.common.spec.trust import CODE_FIELDS, field_code_references
from airflow_tune.trust.rendered import coerce_rendered

#: A Jinja block: an expression, a statement or a comment.
JINJA_BLOCK = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.DOTALL)
_STRING_TOKEN = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'", re.DOTALL)
#: What a template stands for while the text around it is read: a string holding NUL, in JSON and in Python alike
#: (never an import path, and never a key that a field's grammar names).
_OPAQUE = '"\\u0000"'


class WrittenPath(str):
    """An import path the DAG file wrote, with the arguments in whose code positions it stands (its value as a
    string is the path, so sets of them compare with sets of paths)."""

    arguments: frozenset[str]

    def __new__(cls, path: str, arguments: Iterable[str]) -> WrittenPath:
        written = super().__new__(cls, path)
        written.arguments = frozenset(arguments)
        return written

    def __reduce__(self) -> tuple[type[WrittenPath], tuple[str, frozenset[str]]]:
        return (type(self), (str(self), self.arguments))


def literal_import_paths(value: Any, argument: str | None = None) -> set[str]:
    """The import paths written in a code position of ``value``, an operator argument as the DAG file gives it
    (before rendering): only these (or allow-listed ones) may run.

    :param argument: the argument ``value`` is (``"param_space"``, ...), read with that argument's grammar. Without
        it, ``value`` is read as each argument that holds code, and each path is a :class:`WrittenPath` recording
        which of them hold it in a code position: :func:`wrote_in` licenses it for those alone.
    """
    if argument is not None:
        return code_paths(argument, value)
    arguments_of: dict[str, set[str]] = {}
    for name in CODE_FIELDS:
        for path in code_paths(name, value):
            arguments_of.setdefault(path, set()).add(name)
    return {WrittenPath(path, names) for path, names in arguments_of.items()}


def code_paths(argument: str, value: Any) -> set[str]:
    """The import paths in the code positions of ``argument`` holding ``value`` as the DAG file wrote it."""
    refs = field_code_references(argument, as_written(argument, value))
    return {path for _, path in refs if isinstance(path, str) and IMPORT_PATH.match(path)}


def wrote_in(path: str, argument: str, literal: Mapping[str, Iterable[str]]) -> bool:
    """Whether ``literal`` (each argument's written paths) has ``path`` written in a code position of ``argument``.

    A :class:`WrittenPath` counts for the arguments it records; a plain string counts for the argument it is listed
    under (whoever listed it vouches for its position, e.g. the import path of a trainable given as an object).
    """
    for written in literal.get(argument, ()):
        if written == path:
            return argument in getattr(written, "arguments", (argument,))
    return False


def as_written(argument: str, value: Any) -> Any:
    """``value`` as the DAG file wrote it, as the value it renders to, templates standing for opaque strings; None
    when a string reads as no value."""
    if not isinstance(value, str):
        return _json_shaped(value)
    cut = JINJA_BLOCK.sub("\x00", value)
    if "\x00" not in cut:
        return _read(argument, value)
    parsed = _read(argument, _opaque_templates(cut))
    return parsed if isinstance(parsed, (Mapping, list)) else None  # a templated string is never a path


def _read(argument: str, text: str) -> Any:
    try:
        return coerce_rendered(argument, text)
    except (ValueError, TypeError):
        return None


def _opaque_templates(text: str) -> str:
    """``text`` (each template cut to a NUL) with each template, and each quoted string holding one, as
    :data:`_OPAQUE`."""
    out: list[str] = []
    last = 0
    for token in _STRING_TOKEN.finditer(text):
        out.append(text[last : token.start()].replace("\x00", _OPAQUE))
        out.append(_OPAQUE if "\x00" in token.group() else token.group())
        last = token.end()
    out.append(text[last:].replace("\x00", _OPAQUE))
    return "".join(out)


def _json_shaped(value: Any) -> Any:
    """A Python value with its tuples as lists, as its JSON reads (and as the spec holds it)."""
    if isinstance(value, Mapping):
        return {key: _json_shaped(child) for key, child in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_shaped(child) for child in value]
    return value
