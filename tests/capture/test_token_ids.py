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


@pytest.mark.parametrize("bad", [-1, 2**31, 2**70, True, 1.0, "3", None])
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
