"""The size and text `check_json` gives a value are those of `json.dumps(value, ensure_ascii=False)`,
whichever way it was written: orjson for plain values, `json.dumps` for the rest."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.errors import PayloadTooLarge, ValidationError
from tasks.specs import MAX_JSON_DEPTH, check_json

texts = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)  # storable text
scalars = st.none() | st.booleans() | st.integers(-(2**64), 2**64) | texts
floats = st.floats(allow_nan=False, allow_infinity=False)
values = st.recursive(scalars | floats, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(texts, inner, max_size=4), max_leaves=30)


def dumps_size(value) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


@settings(max_examples=400, deadline=None)
@given(values)
def test_the_limit_is_the_size_json_dumps_writes(value):
    size = dumps_size(value)
    text = check_json("input", value, size)
    assert json.loads(text) == value
    with pytest.raises(PayloadTooLarge):
        check_json("input", value, size - 1)


@pytest.mark.parametrize("value", [
    {}, [], "", 0, None, True, {"a": {}}, [[], {}], {"a": [1, "é", None]}, "\x1f\u2028🚀\"\\",
    {"k": "v" * 100}, [1, 2, 3], {"a": 1, "b": [True, False]}, 2**64 - 1, -(2**63),
])
def test_plain_values_count_the_spaces_json_dumps_puts_after_colons_and_commas(value):
    size = dumps_size(value)
    assert check_json("input", value, size)
    with pytest.raises(PayloadTooLarge):
        check_json("input", value, size - 1)


@pytest.mark.parametrize("value", [math.nan, {"x": math.inf}, [-math.inf]])
def test_nan_and_infinity_are_refused(value):
    with pytest.raises(ValidationError, match="NaN or Infinity"):
        check_json("input", value, 10**6)


def test_what_orjson_refuses_or_writes_its_own_way_goes_the_general_way():
    assert json.loads(check_json("input", {"n": 2**70}, 10**6)) == {"n": 2**70}  # beyond 64 bits
    assert json.loads(check_json("input", {1: "a"}, 10**6)) == {"1": "a"}  # a key that is not a string
    assert json.loads(check_json("input", (1, 2), 10**6)) == [1, 2]  # a tuple
    with pytest.raises(ValidationError, match="lone surrogates"):
        check_json("input", {"s": "\ud800"}, 10**6)
    with pytest.raises(ValidationError, match="valid JSON"):
        check_json("input", {"when": object()}, 10**6)


def test_nesting_is_limited_on_either_way():
    def nested(depth, leaf):
        for _ in range(depth):
            leaf = [leaf]
        return leaf

    for leaf in (1, 1.5, []):  # orjson's way, the general way, and an empty list at the bottom
        check_json("input", nested(MAX_JSON_DEPTH - (1 if leaf == [] else 0), leaf), 10**6)
        with pytest.raises(ValidationError, match="nested too deeply"):
            check_json("input", nested(MAX_JSON_DEPTH + 1, leaf), 10**6)
