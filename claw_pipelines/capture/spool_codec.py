"""The spool's record format, built for a cheap append on the request path.

A record is one frame: ``b"CLW1"``, the lengths of its two parts, a CRC32 of both, then the row's
scalar fields as JSON (serialised by pydantic in Rust) and its token-ID / logprob lists as raw
little-endian int32 / float32 buffers (each prefixed by its length, -1 for null). Thousands of
numbers per turn are never written or parsed as JSON text. A frame cut short by a crash (or with
a bad checksum) ends the segment: its turn was never answered.
"""

from __future__ import annotations

import contextlib
import struct
import zlib
from array import array
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Frame:
    """One intact record: its bytes as written, and its scalar JSON and list buffers."""

    raw: memoryview
    scalars: memoryview
    lists: memoryview


def _frames(data: bytes) -> list[Frame]:
    """The complete, intact frames of a segment, up to the first torn or corrupt one."""
    frames = []
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
        frames.append(Frame(view[offset:end], scalar, packed))
        offset = end
    return frames


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


def _decode_frames(frames: list[Frame], table: str) -> pa.Table:
    schema = LANDING_MODELS[table].arrow_schema()
    if not frames:
        return schema.empty_table()
    options = pa_json.ParseOptions(explicit_schema=scalar_schema(table))
    scalars = b"\n".join(frame.scalars for frame in frames)
    rows = pa_json.read_json(pa.py_buffer(scalars), parse_options=options)
    packed = packed_fields(table)
    for name, column in _list_columns([frame.lists for frame in frames], packed).items():
        rows = rows.append_column(schema.field(name), column)
    return rows.select(schema.names).cast(schema)


def decode(data: bytes, table: str) -> pa.Table:
    """The rows of a segment's bytes, up to the first torn or corrupt frame."""
    return _decode_frames(_frames(data), table)


def decode_salvaging(data: bytes, table: str) -> tuple[pa.Table, list[bytes]]:
    """The decodable rows of a segment, and the raw frames that cannot be decoded.

    One bad row (say a null in a required column) must not cost the segment's other rows, so
    when the whole segment does not decode, its frames are decoded one by one.
    """
    frames = _frames(data)
    with contextlib.suppress(Exception):
        return _decode_frames(frames, table), []
    decoded, undecodable = [], []
    for frame in frames:
        try:
            decoded.append(_decode_frames([frame], table))
        except Exception:
            undecodable.append(bytes(frame.raw))
    rows = pa.concat_tables(decoded) if decoded else _decode_frames([], table)
    return rows, undecodable
