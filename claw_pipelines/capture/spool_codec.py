"""The spool's record format, built for a cheap append on the request path.

A record is one frame: ``b"CLW1"``, the lengths of its two parts, a CRC32 of both, then the row's
scalar fields as JSON (serialised by pydantic in Rust) and its token-ID / logprob lists as raw
little-endian int32 / float32 buffers (each prefixed by its length, -1 for null). Thousands of
numbers per turn are never written or parsed as JSON text. A frame cut short by a crash (or with
a bad checksum) ends the segment: its turn was never answered.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from functools import cache

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from claw_pipelines.schemas import LANDING_MODELS, LandingRow

MAGIC = b"CLW1"
HEADER = struct.Struct("<4sIII")
LENGTH = struct.Struct("<i")
PACKED_TYPES = {pa.list_(pa.int32()): ("i", np.int32), pa.list_(pa.float32()): ("f", np.float32)}


@cache
def packed_fields(table: str) -> dict[str, pa.DataType]:
    """Fields of ``table`` stored as raw buffers (int32 / float32 lists), in schema order."""
    schema = LANDING_MODELS[table].arrow_schema()
    return {f.name: f.type for f in schema if f.type in PACKED_TYPES}


@cache
def scalar_schema(table: str) -> pa.Schema:
    schema = LANDING_MODELS[table].arrow_schema()
    return pa.schema([f for f in schema if f.name not in packed_fields(table)])


def encode(row: LandingRow) -> bytes:
    """One spool frame for ``row``."""
    packed = packed_fields(row.table_name)
    scalars = row.model_dump_json(exclude=set(packed)).encode()
    buffers = []
    for name, kind in packed.items():
        values = getattr(row, name)
        if values is None:
            buffers.append(LENGTH.pack(-1))
        else:
            buffers += [LENGTH.pack(len(values)), array(PACKED_TYPES[kind][0], values).tobytes()]
    lists = b"".join(buffers)
    checksum = zlib.crc32(lists, zlib.crc32(scalars))
    return HEADER.pack(MAGIC, len(scalars), len(lists), checksum) + scalars + lists


def _frames(data: bytes) -> tuple[list[memoryview], list[memoryview]]:
    """Split a segment into (scalar JSON, list buffers) per complete, intact frame."""
    scalars, lists = [], []
    offset = 0
    view = memoryview(data)
    while offset + HEADER.size <= len(data):
        magic, scalar_len, lists_len, checksum = HEADER.unpack_from(data, offset)
        start = offset + HEADER.size
        end = start + scalar_len + lists_len
        if magic != MAGIC or end > len(data):
            break
        scalar, packed = view[start : start + scalar_len], view[start + scalar_len : end]
        if zlib.crc32(packed, zlib.crc32(scalar)) != checksum:
            break
        scalars.append(scalar)
        lists.append(packed)
        offset = end
    return scalars, lists


def _list_columns(lists: list[memoryview], packed: dict[str, pa.DataType]) -> dict[str, pa.Array]:
    """Rebuild each packed field as an Arrow list column from the frames' raw buffers.

    Per frame only the buffer boundaries are read; each column's values are then joined into
    one buffer and viewed as a numpy array in a single call.
    """
    slices: dict[str, list[memoryview]] = {name: [] for name in packed}
    lengths: dict[str, list[int]] = {name: [] for name in packed}
    for buffer in lists:
        offset = 0
        for name in packed:
            (length,) = LENGTH.unpack_from(buffer, offset)
            offset += LENGTH.size
            lengths[name].append(length)
            if length > 0:
                slices[name].append(buffer[offset : offset + length * 4])
                offset += length * 4
    columns = {}
    for name, kind in packed.items():
        sizes = np.array(lengths[name], dtype=np.int64)
        missing = sizes < 0
        offsets = np.concatenate([[0], np.cumsum(np.where(missing, 0, sizes))]).astype(np.int32)
        values = np.frombuffer(b"".join(slices[name]), dtype=PACKED_TYPES[kind][1])
        column = pa.ListArray.from_arrays(
            pa.array(offsets), pa.array(values), mask=pa.array(missing, type=pa.bool_())
        )
        columns[name] = column.cast(kind)
    return columns


def decode(data: bytes, table: str) -> pa.Table:
    """The rows of a segment's bytes, up to the first torn or corrupt frame."""
    schema = LANDING_MODELS[table].arrow_schema()
    scalars, lists = _frames(data)
    if not scalars:
        return schema.empty_table()
    options = pa_json.ParseOptions(explicit_schema=scalar_schema(table))
    rows = pa_json.read_json(pa.py_buffer(b"\n".join(scalars)), parse_options=options)
    packed = packed_fields(table)
    for name, column in _list_columns(lists, packed).items():
        rows = rows.append_column(schema.field(name), column)
    return rows.select(schema.names).cast(schema)
