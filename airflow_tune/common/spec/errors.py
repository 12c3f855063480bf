"""How a spec says what is wrong: every problem names the field, the value and the fix, and all are collected."""

from __future__ import annotations

import difflib
import json
import math
from typing import Any


class SpecError(ValueError):
    """A spec that cannot run. ``errors`` lists every problem found, each naming the field, the value and the fix."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        lines = "\n".join(f"  - {e}" for e in errors)
        super().__init__(f"invalid experiment spec ({len(errors)} problem{'s' if len(errors) > 1 else ''}):\n{lines}")

    def __reduce__(self) -> tuple[type[SpecError], tuple[list[str]]]:
        # Rebuild from the list, not from the formatted message (crossing a process keeps the message intact).
        return (type(self), (self.errors,))


def show(value: Any) -> str:
    try:
        text = json.dumps(value, default=repr) if not isinstance(value, str) else repr(value)
    except (TypeError, ValueError):  # e.g. a dict with non-string keys from a Python caller
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def did_you_mean(key: Any, known: Any) -> str | None:
    """The closest known name to a misspelt ``key``: case, underscores and small typos."""
    text = str(key)
    for k in known:
        if k.replace("_", "") == text.lower().replace("_", ""):
            return str(k)
    close = difflib.get_close_matches(text.lower(), list(known), n=1, cutoff=0.6)
    return close[0] if close else None


class Errors:
    """Problems collected while checking a spec; raise them all at once with :meth:`raise_if_any`."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, value: Any, problem: str, fix: str) -> None:
        self.items.append(f"{path} = {show(value)}: {problem}; {fix}")

    def raise_if_any(self) -> None:
        if self.items:
            raise SpecError(self.items)
