"""Intern tables shared by the hot path and the dumper: strings and tensor signatures.

The hot path looks a value up in a dict and gets a small int to store in the ring; only a
miss takes the lock and builds the table value. Tables only grow, so an index stored in a ring
slot stays valid for the life of the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

from flightrec.format.builder import TensorTuple

TensorSig = tuple[TensorTuple, ...]


class Interner:
    """Maps hashable keys to dense ints; ``values[i]`` holds what index ``i`` stands for."""

    def __init__(self, empty: Any, on_new: Callable[[int, Any], None] | None = None) -> None:
        self.index: dict[Hashable, int] = {}
        self.values: list[Any] = [empty]
        self._lock = threading.Lock()
        self.on_new = on_new
        """Told of each new value under the lock, in index order (the black box's journal)."""

    def add(self, key: Hashable, make: Callable[[], Any]) -> int:
        """Index of ``key``, building its value with ``make()`` the first time."""
        with self._lock:
            index = self.index.get(key)
            if index is None:
                index = len(self.values)
                value = make()
                self.values.append(value)
                self.index[key] = index
                if self.on_new is not None:
                    self.on_new(index, value)
            return index


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_sig(tensors: Any) -> TensorSig:
    """Shapes and dtype names of a tensor, a list of tensors, or a list of lists of tensors."""
    if tensors is None:
        return ()
    if hasattr(tensors, "shape"):
        return ((tuple(tensors.shape), _dtype_name(tensors.dtype)),)
    out: list[TensorTuple] = []
    for item in tensors:
        out.extend(tensor_sig(item))
    return tuple(out)


def tensor_key(tensors: Any) -> Hashable:
    """A cheap hashable key with the same information as ``tensor_sig`` (no string building)."""
    if tensors is None:
        return None
    if hasattr(tensors, "shape"):
        return (tensors.shape, tensors.dtype)
    return tuple([tensor_key(item) for item in tensors])


class TensorTable(Interner):
    """Tensor signatures; index 0 means "no tensors"."""

    def __init__(self, on_new: Callable[[int, Any], None] | None = None) -> None:
        super().__init__((), on_new)
        self.index[None] = 0

    def of(self, tensors: Any) -> int:
        """Index of the signature of ``tensors`` (a tensor, a list, nested lists, or None)."""
        key = tensor_key(tensors)
        index = self.index.get(key)
        if index is None:
            index = self.add(key, lambda: tensor_sig(tensors))
        return index


class StringTable(Interner):
    """Strings stored in ring columns: op names, reduce ops, thread names, devices."""

    def __init__(self, on_new: Callable[[int, Any], None] | None = None) -> None:
        super().__init__("", on_new)
        self.index[""] = 0

    def of(self, key: Hashable, make: Callable[[], str]) -> int:
        """Index of the string that ``key`` stands for, built by ``make()`` on first sight."""
        index = self.index.get(key)
        if index is None:
            index = self.add(key, make)
        return index
