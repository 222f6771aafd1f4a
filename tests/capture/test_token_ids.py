"""Token-ID lists are checked as a whole (``schemas._token_ids``) with the item-by-item rules."""

from __future__ import annotations

from array import array

import pytest
from pydantic import TypeAdapter, ValidationError

from claw_pipelines.schemas import TokenId, TokenIds
from claw_pipelines.spool import codec

WHOLE = TypeAdapter(TokenIds)
ITEM_BY_ITEM = TypeAdapter(list[TokenId])


def test_int32_vocabulary_indices_pass_as_they_came() -> None:
    ids = [0, 7, 2**31 - 1]
    assert WHOLE.validate_python(ids) == ids
    assert WHOLE.validate_python([]) == []


@pytest.mark.parametrize("bad", [-1, 2**31, 2**70, True, False, 1.0, "3", None, [1]])
def test_a_bad_item_fails_as_item_by_item_validation_does(bad: object) -> None:
    """The error names the first bad item (``response_token_ids[7]`` in the agent's 502)."""
    ids = [5, 6, bad, -2]
    with pytest.raises(ValidationError) as whole:
        WHOLE.validate_python(ids)
    with pytest.raises(ValidationError) as item_by_item:
        ITEM_BY_ITEM.validate_python(ids)
    assert whole.value.errors() == item_by_item.value.errors()
    assert whole.value.errors()[0]["loc"] == (2,)


def test_a_checked_list_keeps_the_int32_buffer_the_spool_writes() -> None:
    """The range check's buffer is the spool's and the prefix memory's: not converted again."""
    ids = [0, 7, 2**31 - 1]
    checked = WHOLE.validate_python(ids)
    assert checked.int32 == array("i", ids).tobytes()
    assert codec.packed(checked, "i") is checked.int32
    assert codec.packed(checked[1:], "i") == array("i", ids[1:]).tobytes()


def test_zeros_and_ones_pass_and_a_boolean_among_them_does_not() -> None:
    """``array`` reads ``True`` as 1, so items read as 0 or 1 are looked at: a boolean anywhere
    in a long prompt is refused, naming it, and genuine 0s and 1s pass."""
    ids = [0, 1, 5] * 20_000
    assert WHOLE.validate_python(ids) == ids
    with pytest.raises(ValidationError) as refused:
        WHOLE.validate_python([*ids, False, 9])
    assert refused.value.errors()[0]["loc"] == (len(ids),)


def test_other_sequences_and_checked_lists() -> None:
    """A tuple is validated item by item, as pydantic does; a list checked before passes as
    it is, with its buffer."""
    assert WHOLE.validate_python((3, 4)) == [3, 4]
    checked = WHOLE.validate_python([3, 4])
    assert WHOLE.validate_python(checked) is checked
