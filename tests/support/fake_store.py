"""Storage as a dict of URI -> content, as the disjointness check (:mod:`airflow_tune.trust.disjoint`) sees a store: the
unit tests' fake S3 (``{"s3://bkt/exps/exp/.airflow_tune/result.json": {...}}``) answers its probes too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from airflow_tune.common.spec.naming import StorageLocation, parse_storage_uri


class DictStore:
    """The :class:`airflow_tune.trust.disjoint.Store` over ``files`` (values: bytes, or JSON-able content), for one
    bucket; ``requests`` counts the calls, ``walked`` the keys a listing handed out, ``unreadable`` lists folders (by
    URI)
    whose entries cannot be probed (as with an S3 AccessDenied)."""

    registries = True

    def __init__(self, files: dict[str, Any], folder: StorageLocation) -> None:
        self.files, self.scheme, self.bucket = files, folder.scheme, folder.bucket
        self.requests = 0
        self.walked = 0
        self.unreadable: set[str] = set()

    def _keys(self) -> list[tuple[str, ...]]:
        out = []
        for uri in list(self.files):
            where = parse_storage_uri(uri)
            if (where.scheme, where.bucket) == (self.scheme, self.bucket):
                out.append(where.segments)
        return sorted(out, key="/".join)

    def _ask(self, path: tuple[str, ...]) -> None:
        self.requests += 1
        if any(parse_storage_uri(folder).segments == path[:-1] for folder in self.unreadable):
            raise OSError(f"AccessDenied: {'/'.join(path)}")

    def _below(self, folder: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        return (key[len(folder) :] for key in self._keys() if key[: len(folder)] == folder and key != folder)

    def first_below(self, folder: tuple[str, ...]) -> tuple[str, ...] | None:
        self._ask(folder)
        return next(self._below(folder), None)

    def is_file(self, path: tuple[str, ...]) -> bool:
        self._ask(path)
        return path in self._keys()

    def walk(self, folder: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        self._ask(folder)
        for key in self._below(folder):
            self.walked += 1
            yield key

    def read(self, path: tuple[str, ...], limit: int) -> bytes | None:
        self._ask(path)
        value = self.files.get(StorageLocation(self.scheme, self.bucket, path).uri)
        if value is None:
            return None
        return (value if isinstance(value, bytes) else json.dumps(value).encode())[:limit]


def dict_stores(files: dict[str, Any]) -> Any:
    """A ``store_for`` replacement: the :class:`DictStore` over ``files`` of the folder's bucket."""
    return lambda folder: DictStore(files, folder)
