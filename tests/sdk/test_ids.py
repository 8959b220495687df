"""Run and task ids: UUIDv7, increasing in the order they were made."""

import uuid

from valka_sdk.ids import uuid7, uuid7_many, uuid7_text_many


def test_ids_as_text_are_canonical_version_7_and_increasing():
    texts = uuid7_text_many(5000)  # more than one millisecond's counter can hold
    parsed = [uuid.UUID(t) for t in texts]
    assert texts == [str(u) for u in parsed]
    assert {u.version for u in parsed} == {7}
    assert {u.variant for u in parsed} == {uuid.RFC_4122}
    assert parsed == sorted(parsed) and len(set(parsed)) == len(parsed)


def test_every_kind_of_id_follows_the_one_before():
    first = uuid7()
    many = uuid7_many(3)
    text = uuid.UUID(uuid7_text_many(1)[0])
    assert first < many[0] < many[1] < many[2] < text
