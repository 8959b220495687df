"""Arrays sent to PostgreSQL in binary, for the statements that carry a batch.

psycopg writes a list in text format by quoting and escaping each element in
Python: about 4 µs per element, 2 ms for the 500 task ids of one busy flush,
which made array dumping a twentieth of the dispatcher's CPU. In binary each
element is written by psycopg's C dumpers, four times faster.

A `BinaryArray` is a plain list everywhere else: a connection whose adapters
went through `register()` sends it in binary; any other (Django's, a test's)
sends it as text like any list. Its elements travel typed (text for `str`),
so statements cast them (`%(ids)s::uuid[]`) rather than let PostgreSQL infer
the type from an untyped literal.
"""

from __future__ import annotations

from typing import Any

from psycopg.adapt import AdaptersMap
from psycopg.types.array import ListBinaryDumper


class BinaryArray(list[Any]):
    """A list for an array parameter that `register()`ed connections send in binary."""


def register(adapters: AdaptersMap) -> None:
    adapters.register_dumper(BinaryArray, ListBinaryDumper)
