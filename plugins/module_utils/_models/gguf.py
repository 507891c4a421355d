# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""A split GGUF (llama.cpp's name-00001-of-00010.gguf parts) read and laid out as one file, for engines that load a
single GGUF only (vLLM).

GGUF v2/v3: the magic, a version, the tensor and key-value counts, the key-values, each tensor's info (name, shape,
type, offset into the data section), padding to the file's alignment, the data. Each part carries split.no,
split.count and split.tensors.count; the first also carries the model's metadata. The merged file keeps the first
part's key-values but the split.* ones, every part's tensor infos with their offsets moved by where the part's data
lands, and the parts' data sections one after another, each starting at the alignment. Only headers are parsed here;
the data is copied as it is.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# the value types of GGUF's key-values, by id: the size of a fixed one, or its name
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY, UINT32 = 8, 9, 4
SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")


class _Reader:
    def __init__(self, handle, name: str):
        self.handle, self.name, self.position = handle, name, 0

    def take(self, count: int) -> bytes:
        data = self.handle.read(count)
        if len(data) != count:
            raise InvalidInput(f"{self.name}: ends inside its GGUF header (at byte {self.position + len(data)})")
        self.position += count
        return data

    def unsigned(self, size: int) -> int:
        return int.from_bytes(self.take(size), "little")

    def string(self) -> bytes:
        length = self.unsigned(8)
        if length > 1 << 24:
            raise InvalidInput(f"{self.name}: a GGUF string of {length} bytes: not a GGUF header")
        return self.take(length)

    def value(self, kind: int) -> bytes:
        """The raw bytes of one value of this type."""
        if kind in FIXED:
            return self.take(FIXED[kind])
        if kind == STRING:
            raw = self.string()
            return len(raw).to_bytes(8, "little") + raw
        if kind == ARRAY:
            item_kind = self.unsigned(4)
            count = self.unsigned(8)
            fixed = FIXED.get(item_kind)
            items = self.take(fixed * count) if fixed else b"".join(self.value(item_kind) for _item in range(count))
            return item_kind.to_bytes(4, "little") + count.to_bytes(8, "little") + items
        raise InvalidInput(f"{self.name}: unknown GGUF value type {kind}")


@dataclass
class Part:
    """One file of a split GGUF, as far as its header goes."""

    name: str
    version: int
    values: dict[str, tuple[int, bytes]]  # key: (type, raw value), in file order
    tensors: list[tuple[bytes, int]] = field(default_factory=list)  # (raw info up to its offset, offset)
    data_start: int = 0
    size: int = 0

    @property
    def alignment(self) -> int:
        kind, raw = self.values.get("general.alignment", (UINT32, DEFAULT_ALIGNMENT.to_bytes(4, "little")))
        return (int.from_bytes(raw, "little") or DEFAULT_ALIGNMENT) if kind == UINT32 else DEFAULT_ALIGNMENT

    def number(self, key: str) -> int | None:
        found = self.values.get(key)
        if found is None:
            return None
        kind, raw = found
        return int.from_bytes(raw, "little", signed=kind in (1, 3, 5, 11))


def read_part(handle, name: str, size: int) -> Part:
    reader = _Reader(handle, name)
    if reader.take(4) != MAGIC:
        raise InvalidInput(f"{name}: not a GGUF file (no GGUF magic)")
    version = reader.unsigned(4)
    if version not in (2, 3):
        raise InvalidInput(f"{name}: GGUF version {version} (2 and 3 are read)")
    tensor_count, value_count = reader.unsigned(8), reader.unsigned(8)
    values = {}
    for _value in range(value_count):
        key = reader.string().decode(errors="replace")
        kind = reader.unsigned(4)
        values[key] = (kind, reader.value(kind))
    part = Part(name, version, values, size=size)
    for _tensor in range(tensor_count):
        info = bytearray()
        raw_name = reader.string()
        info += len(raw_name).to_bytes(8, "little") + raw_name
        dims = reader.unsigned(4)
        info += dims.to_bytes(4, "little") + reader.take(8 * dims) + reader.take(4)
        part.tensors.append((bytes(info), reader.unsigned(8)))
    part.data_start = _aligned(reader.position, part.alignment)
    if part.data_start > size:
        raise InvalidInput(f"{name}: shorter ({size} bytes) than its own GGUF header ({part.data_start})")
    return part


def _aligned(offset: int, alignment: int) -> int:
    return offset + (-offset % alignment)


@dataclass
class MergePlan:
    header: bytes  # the merged file's header, padded to its alignment
    copies: list[tuple[str, int, int]]  # (part name, from byte, length) in order
    pads: list[int]  # zero bytes after each copy, so that the next part's data starts aligned
    size: int  # the merged file's size


def plan_merge(parts: list[Part]) -> MergePlan:
    """The merged file of a whole split GGUF, its parts in any order; refuses a part missing, doubled or foreign."""
    if not parts:
        raise InvalidInput("no GGUF part given")
    numbered = {}
    for part in parts:
        number, count = part.number("split.no"), part.number("split.count")
        if number is None or count is None:
            raise InvalidInput(f"{part.name}: not a part of a split GGUF (no split.no / split.count)")
        if number in numbered:
            raise InvalidInput(f"{part.name} and {numbered[number].name} are both part {number + 1}")
        numbered[number] = part
    count = parts[0].number("split.count")
    if {part.number("split.count") for part in parts} != {count} or sorted(numbered) != list(range(count)):
        missing = sorted(set(range(count)) - set(numbered))
        raise InvalidInput(f"the split GGUF has {count} parts; missing: {', '.join(str(n + 1) for n in missing) or 'none'}, "
                           f"or the parts disagree on their count")
    ordered = [numbered[number] for number in range(count)]
    first = ordered[0]
    expected = first.number("split.tensors.count")
    total = sum(len(part.tensors) for part in ordered)
    if expected is not None and expected != total:
        raise InvalidInput(f"{first.name} says {expected} tensors in all; the parts hold {total}")
    alignment = first.alignment
    values = [(key, kind, raw) for key, (kind, raw) in first.values.items() if key not in SPLIT_KEYS]
    infos, copies, pads, base = [], [], [], 0
    for part in ordered:
        length = part.size - part.data_start
        for raw_info, offset in part.tensors:
            if offset > length:
                raise InvalidInput(f"{part.name}: a tensor's data begins past the end of the file")
            infos.append(raw_info + (base + offset).to_bytes(8, "little"))
        copies.append((part.name, part.data_start, length))
        pads.append(_aligned(length, alignment) - length)
        base += length + pads[-1]
    header = bytearray(MAGIC + struct.pack("<IQQ", first.version, total, len(values)))
    for key, kind, raw in values:
        encoded = key.encode()
        header += len(encoded).to_bytes(8, "little") + encoded + kind.to_bytes(4, "little") + raw
    for info in infos:
        header += info
    header += bytes(_aligned(len(header), alignment) - len(header))
    pads[-1] = 0  # nothing after the last tensor's data
    return MergePlan(bytes(header), copies, pads, len(header) + sum(copy[2] for copy in copies) + sum(pads))


def merged_problems(merged: Part, plan: MergePlan, parts: list[Part]) -> list[str]:
    """Whether a merged file, its header read back, is what the plan wrote: its length, every tensor of every part once,
    each at the offset the plan gave it."""
    problems = []
    if merged.size != plan.size:
        problems.append(f"{merged.name} has {merged.size} bytes, its plan {plan.size}")
    names = [_tensor_name(info) for info, _offset in merged.tensors]
    expected = [_tensor_name(info) for part in parts for info, _offset in part.tensors]
    if len(set(names)) != len(names):
        problems.append(f"{merged.name} names a tensor twice")
    if sorted(names) != sorted(expected):
        problems.append(f"{merged.name} holds {len(names)} tensors, its parts {len(expected)}")
    planned = _planned_offsets(plan.header, merged)
    if planned is not None and [offset for _info, offset in merged.tensors] != planned:
        problems.append(f"{merged.name}: a tensor's offset is not where its part's data was copied")
    if merged.data_start != len(plan.header):
        problems.append(f"{merged.name}: its data begins at {merged.data_start}, the plan's at {len(plan.header)}")
    return problems


def _tensor_name(info: bytes) -> bytes:
    length = int.from_bytes(info[:8], "little")
    return info[8:8 + length]


def _planned_offsets(header: bytes, merged: Part) -> list[int] | None:
    """The offsets the plan's header holds, read as the merged file's own header is."""
    import io

    try:
        return [offset for _info, offset in read_part(io.BytesIO(header), "plan", len(header)).tensors]
    except InvalidInput:
        return None
