"""The spool's record format, built for a cheap append on the request path.

A record is one frame: ``b"CLW1"``, the lengths of its two parts, a CRC32 of both, then the row's
scalar fields as JSON (serialised by pydantic in Rust) and its token-ID / logprob lists as raw
little-endian int32 / float32 buffers (each prefixed by its length, -1 for null). Thousands of
numbers per turn are never written or parsed as JSON text.

Reading a segment never stops silently: a frame cut short at the end of a segment (a write a crash
interrupted, whose turn was never answered) is reported as a torn tail, and damaged bytes in the
middle are skipped up to the next intact frame and reported, so the frames after them still land.
A row is any size: the JSON reader's block grows to the longest row of the batch.
"""

from __future__ import annotations

import contextlib
import struct
import zlib
from array import array
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from claw_pipelines.schemas import LANDING_MODELS, LandingRow

MAGIC = b"CLW1"
HEADER = struct.Struct("<4sIII")
LENGTH = struct.Struct("<i")
JSON_BLOCK_BYTES = 1 << 20
"""pyarrow's default JSON block; a row longer than its block would fail to decode."""
MAX_SCALAR_BYTES = 2**31 - 2
"""A row's JSON must fit one JSON block, whose size pyarrow takes as an int32."""


class RowTooLarge(ValueError):
    """A row the spool cannot frame (its JSON is over ``MAX_SCALAR_BYTES``)."""


PACKED_TYPES = {pa.list_(pa.int32()): "i", pa.list_(pa.float32()): "f"}
"""The packed list types and their ``array`` typecodes (both 4 bytes an item)."""


@cache
def packed_fields(table: str) -> dict[str, pa.DataType]:
    """Fields of ``table`` stored as raw buffers (int32 / float32 lists), in schema order."""
    schema = LANDING_MODELS[table].arrow_schema()
    return {f.name: f.type for f in schema if f.type in PACKED_TYPES}


@cache
def scalar_schema(table: str) -> pa.Schema:
    schema = LANDING_MODELS[table].arrow_schema()
    return pa.schema([f for f in schema if f.name not in packed_fields(table)])


@cache
def _packing(table: str) -> tuple[frozenset[str], tuple[tuple[str, str], ...]]:
    """What ``encode`` needs of ``table``'s packed fields, per row: their names (left out of the
    JSON) and each one's ``array`` typecode. Looked up per row, hashing an Arrow type cost more
    than the row's JSON."""
    packed = packed_fields(table)
    return frozenset(packed), tuple((name, PACKED_TYPES[kind]) for name, kind in packed.items())


def packed(values: list, typecode: str) -> bytes:
    """``values`` as raw ``typecode`` items: validated token IDs (``TokenIdList``) bring their
    int32 buffer, made once when the row was checked; any other list is converted."""
    buffer = getattr(values, "int32", None) if typecode == "i" else None
    return array(typecode, values).tobytes() if buffer is None else buffer


def encode(row: LandingRow) -> bytes:
    """One spool frame for ``row``."""
    excluded, packing = _packing(row.table_name)
    scalars = row.model_dump_json(exclude=excluded).encode()
    if len(scalars) > MAX_SCALAR_BYTES:
        raise RowTooLarge(f"a {row.table_name} row of {len(scalars)} bytes is over the limit")
    buffers = []
    for name, typecode in packing:
        values = getattr(row, name)
        if values is None:
            buffers.append(LENGTH.pack(-1))
        else:
            buffers += [LENGTH.pack(len(values)), packed(values, typecode)]
    lists = b"".join(buffers)
    checksum = zlib.crc32(lists, zlib.crc32(scalars))
    return HEADER.pack(MAGIC, len(scalars), len(lists), checksum) + scalars + lists


class Frame(NamedTuple):
    """One intact record: its bytes as written, and its scalar JSON and list buffers. (A tuple:
    a segment holds thousands, and a frozen dataclass costs a microsecond more each.)"""

    raw: memoryview
    scalars: memoryview
    lists: memoryview


@dataclass(frozen=True)
class Scan:
    """What a segment's bytes hold: its intact frames, damaged stretches between them (bytes that
    are no frame, followed by an intact one) and the length of a torn tail (an unfinished last
    frame)."""

    frames: list[Frame]
    damaged: list[bytes]
    torn_tail: int


def _frame_at(data: bytes, view: memoryview, offset: int) -> Frame | None:
    """The intact frame starting at ``offset``, or None (short, wrong magic, bad checksum)."""
    if offset + HEADER.size > len(data):
        return None
    magic, scalar_len, lists_len, checksum = HEADER.unpack_from(data, offset)
    start = offset + HEADER.size
    end = start + scalar_len + lists_len
    if magic != MAGIC or end > len(data):
        return None
    if zlib.crc32(view[start:end]) != checksum:  # the CRC of both parts, which are adjacent
        return None
    return Frame(view[offset:end], view[start : start + scalar_len], view[start + scalar_len : end])


def scan(data: bytes) -> Scan:
    """Split a segment into intact frames, damaged stretches and a torn tail.

    After a bad frame the scan resumes at the next magic that starts an intact frame (the
    checksum rules out a magic that happens to occur inside a row), so one damaged frame never
    hides the frames written after it.
    """
    view = memoryview(data)
    frames: list[Frame] = []
    damaged: list[bytes] = []
    offset = 0
    while offset < len(data):
        frame = _frame_at(data, view, offset)
        if frame is not None:
            frames.append(frame)
            offset += len(frame.raw)
            continue
        resume = data.find(MAGIC, offset + 1)
        while resume != -1 and _frame_at(data, view, resume) is None:
            resume = data.find(MAGIC, resume + 1)
        if resume == -1:
            return Scan(frames, damaged, len(data) - offset)
        damaged.append(bytes(view[offset:resume]))
        offset = resume
    return Scan(frames, damaged, 0)


def _list_columns(lists: list[memoryview], packed: dict[str, pa.DataType]) -> dict[str, pa.Array]:
    """Rebuild each packed field as an Arrow list column from the frames' raw buffers.

    The frames' list parts are joined into one buffer, where each field's lengths are read for
    all frames at once; each column's values are then joined into one buffer that becomes its
    child array as it is. The arrays are made from their buffers, not with ``pa.array``: handed
    a numpy array (or a list), pyarrow imports pandas to see whether it is one of its types,
    which cost the proxy about a second of CPU at its first commit and a heavier garbage
    collection for the rest of its life.
    """
    joined = b"".join(lists)
    view, octets = memoryview(joined), np.frombuffer(joined, dtype=np.uint8)
    at = np.cumsum([0, *map(len, lists[:-1])], dtype=np.int64)
    columns = {}
    for name, kind in packed.items():
        sizes = octets[at[:, None] + np.arange(LENGTH.size)].view("<i4").ravel()
        missing = sizes < 0
        counts = np.where(missing, 0, sizes).astype(np.int64)
        begins = at + LENGTH.size
        at = begins + counts * 4
        values = b"".join([view[b:e] for b, e in zip(begins.tolist(), at.tolist(), strict=True)])
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        items = pa.Array.from_buffers(
            kind.value_type, len(values) // 4, [None, pa.py_buffer(values)]
        )
        valid = pa.py_buffer(np.packbits(~missing, bitorder="little"))
        columns[name] = pa.Array.from_buffers(
            kind,
            len(sizes),
            [valid, pa.py_buffer(offsets)],
            null_count=int(missing.sum()),
            children=[items],
        )
    return columns


def _decode_frames(frames: list[Frame], table: str) -> pa.Table:
    schema = LANDING_MODELS[table].arrow_schema()
    if not frames:
        return schema.empty_table()
    options = pa_json.ParseOptions(explicit_schema=scalar_schema(table))
    longest = max(len(frame.scalars) for frame in frames)
    block = pa_json.ReadOptions(block_size=max(JSON_BLOCK_BYTES, longest + 1))
    scalars = b"\n".join(frame.scalars for frame in frames)
    rows = pa_json.read_json(pa.py_buffer(scalars), read_options=block, parse_options=options)
    packed = packed_fields(table)
    for name, column in _list_columns([frame.lists for frame in frames], packed).items():
        rows = rows.append_column(schema.field(name), column)
    return rows.select(schema.names).cast(schema)


def decode(data: bytes, table: str) -> pa.Table:
    """The rows of a segment's intact frames."""
    return _decode_frames(scan(data).frames, table)


def decode_salvaging(frames: list[Frame], table: str) -> tuple[pa.Table, list[bytes]]:
    """The decodable rows of a segment's frames, and the raw frames that cannot be decoded.

    One bad row (say a null in a required column) must not cost the segment's other rows, so
    when the frames do not decode together, they are decoded one by one.
    """
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
