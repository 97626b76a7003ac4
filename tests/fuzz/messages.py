"""Fuzz inputs for any protobuf request type, built from its descriptor alone (so new RPCs and fields are covered
without editing the harness): random, boundary and adversarial field values, and raw bytes that are not a valid
message at all (truncated, wrong wire types, invalid UTF-8, random, nested too deep).

Everything is drawn from one `random.Random`, so a case is reproduced by (seed, RPC, index).
"""

from __future__ import annotations

import math
import random
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

F = FieldDescriptor
NOW_S = int(time.time())

INT32 = [0, 1, -1, 2, 7, 24, 100, 3600, 2**31 - 1, -(2**31), 2**15, -100]
INT64 = [0, 1, -1, 2, 24, 3600, 86_400, NOW_S, -NOW_S, 2**31, 2**32, 2**53 + 1, 2**63 - 1, -(2**63), 10**15]
UINT32 = [0, 1, 2, 24, 100, 4096, 2**31, 2**32 - 1]
UINT64 = [0, 1, 2, 1024, 2**30, 2**32, 2**53 + 1, 2**63, 2**64 - 1, 10**15]
DOUBLES = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 24.0, 100.0, 3600.0, float(NOW_S), 1e-300, 5e-324, 1e300, -1e300,
           1.7976931348623157e308, -1.7976931348623157e308, math.nan, math.inf, -math.inf, 1e15, -1e15, 0.999999]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 3.4e38, -3.4e38, 1e-45, math.nan, math.inf, -math.inf, 100.0]
STRINGS = [
    "", " ", "a", "default", "x" * 64, "x" * 4096, "\n", "a\nb", "nl\n", "\x00", "a\x00b", "\t\r", "é", "日本語",
    "🙂" * 8, "\u202eevil", "\ufeff", "../../etc/passwd", "/", ".", "..", "a/b", "%s%s%n", "'; DROP TABLE x; --",
    "http://127.0.0.1:1", "http://", "http://[::1", "http://h:99999", "ftp://x", "unix:///tmp/x", "127.0.0.1:1",
    "-1", "0", "NaN", "inf", "1e309", "null", "{}", "[]", "true", "A100-40GB", "1g.5gb", "7g.40gb", "GPU-0",
    "MIG-0", "US-CAL-CISO", "DE", "carbon", "load", "lru", "lcs", "meta-llama/Meta-Llama-3-8B-Instruct",
]
HUGE_STRING_CHARS = 100_000
# Size budget of one case (characters of strings and bytes, plus BUDGET_PER_ELEMENT per repeated element), so
# that nested repeated fields of huge strings stay one oversized request, not gigabytes in the harness.
CASE_BUDGET = 400_000
BUDGET_PER_ELEMENT = 64
OVERSIZED_BYTES = 1_150_000  # above the 1 MiB message limit the fuzzed servers run with


@dataclass
class Corpus:
    """Strings and numbers seen in OK replies, offered back as inputs so calls reach past "not found"."""

    strings: list[str] = field(default_factory=list)
    ints: list[int] = field(default_factory=list)
    limit: int = 400

    def harvest(self, message: Any, depth: int = 0) -> None:
        if depth > 6:
            return
        for fd, value in message.ListFields():
            values = value if _is_repeated(fd) else [value]
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                values = [v for kv in value.items() for v in kv]
                for v in values:
                    self._add(v)
                continue
            for v in values:
                if fd.type == F.TYPE_MESSAGE:
                    self.harvest(v, depth + 1)
                else:
                    self._add(v)

    def _add(self, v: Any) -> None:
        if isinstance(v, str) and v and len(v) <= 512 and v not in self.strings:
            self.strings.append(v)
            del self.strings[: -self.limit]
        elif isinstance(v, int) and not isinstance(v, bool) and v not in self.ints:
            self.ints.append(v)
            del self.ints[: -self.limit]
        elif hasattr(v, "ListFields"):
            self.harvest(v, 1)


def _is_repeated(fd: FieldDescriptor) -> bool:
    return getattr(fd, "is_repeated", None) if hasattr(fd, "is_repeated") else fd.label == F.LABEL_REPEATED


class MessageFuzzer:
    """Draws fuzz cases for one request type.

    Three kinds of messages: *plausible* ones (sane values guessed from field names and types, names seen in
    earlier replies) so calls get past the first check and reach deeper code, plausible ones with one field
    made adversarial, and fully adversarial ones; plus raw bytes that are no valid message at all.
    """

    def __init__(self, rng: random.Random, corpus: Corpus, closed_url: str = "http://127.0.0.1:9") -> None:
        self.rng = rng
        self.corpus = corpus
        self.closed_url = closed_url
        self.plausible = False
        self.budget = CASE_BUDGET
        self._hour = (NOW_S // 3600) * 3600 - 60 * 86_400  # plausible times: hourly, increasing, from 60 days ago

    # ------------------------------------------------------------------ plausible values
    def _plausible_scalar(self, fd: FieldDescriptor) -> Any:
        rng, name, t = self.rng, fd.name, fd.type
        if t == F.TYPE_BOOL:
            return rng.random() < 0.5
        if t == F.TYPE_ENUM:
            values = [v.number for v in fd.enum_type.values if v.number != 0] or [0]
            return rng.choice(values)
        if t == F.TYPE_STRING:
            if "url" in name or "endpoint" in name:
                return rng.choice([self.closed_url, "http://127.0.0.1:9/v1", "https://localhost:1"])
            if self.corpus.strings and rng.random() < 0.6:
                return rng.choice(self.corpus.strings)
            return rng.choice(["default", "pool-a", "e1", "e2", "s1", "carbon", "load", "US-CAL-CISO", "DE",
                               "A100-40GB", "1g.5gb", "3g.20gb", "lru", "meta-llama/Meta-Llama-3-8B-Instruct", "hi"])
        if t == F.TYPE_BYTES:
            return rng.randbytes(rng.choice([0, 8, 32]))
        if t in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
            if name.endswith("_frac") or name.endswith("fraction") or "ratio" in name or "prob" in name:
                return rng.choice([0.0, 0.1, 0.5, 0.9, 1.0])
            return rng.choice([0.0, 0.5, 1.0, 2.0, 10.0, 60.0, 100.0, 300.0, 3600.0, rng.uniform(0, 1000)])
        if self.corpus.ints and rng.random() < 0.2:
            return abs(rng.choice(self.corpus.ints)) % (2**31)
        if name.endswith("_bytes"):
            return rng.choice([0, 1024, 2**20, 2**30])
        return rng.choice([0, 1, 2, 3, 8, 24, 48, 72, 100, 168, 3600])

    def _plausible_time(self, message: Any) -> None:
        if message.DESCRIPTOR.full_name == "google.protobuf.Duration":
            message.seconds = self.rng.choice([1, 60, 3600])
            return
        self._hour += 3600
        message.seconds = self._hour

    # ------------------------------------------------------------------ scalar values
    def _int(self, fd: FieldDescriptor) -> int:
        rng = self.rng
        if fd.type in (F.TYPE_UINT32, F.TYPE_FIXED32):
            pool, lo, hi = UINT32, 0, 2**32 - 1
        elif fd.type in (F.TYPE_UINT64, F.TYPE_FIXED64):
            pool, lo, hi = UINT64, 0, 2**64 - 1
        elif fd.type in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
            pool, lo, hi = INT32, -(2**31), 2**31 - 1
        else:
            pool, lo, hi = INT64, -(2**63), 2**63 - 1
        roll = rng.random()
        if roll < 0.15 and self.corpus.ints:
            value = rng.choice(self.corpus.ints)
        elif roll < 0.35:
            value = rng.randint(-5, 100)
        else:
            value = rng.choice(pool)
        return min(max(value, lo), hi)

    def _string(self, fd: FieldDescriptor) -> str:
        value = self._draw_string(fd)
        if len(value) > self.budget:
            value = value[: max(0, min(self.budget, 64))]
        self.budget -= len(value)
        return value

    def _draw_string(self, fd: FieldDescriptor) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.3 and self.corpus.strings:
            base = rng.choice(self.corpus.strings)
            return base if rng.random() < 0.7 else rng.choice([base + "\n", " " + base, base * 3, base[:-1], base.upper()])
        if roll < 0.36:
            return rng.choice("abcxyz") * HUGE_STRING_CHARS
        if roll < 0.45:
            return "".join(chr(rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0xD7FF), rng.randint(0xE000, 0x10FFFF)]))
                           for _ in range(rng.randint(1, 24)))
        return rng.choice(STRINGS)

    def _scalar(self, fd: FieldDescriptor) -> Any:
        if self.plausible:
            return self._plausible_scalar(fd)
        rng = self.rng
        t = fd.type
        if t == F.TYPE_BOOL:
            return rng.random() < 0.5
        if t == F.TYPE_DOUBLE:
            return rng.choice(DOUBLES) if rng.random() < 0.7 else rng.uniform(-1e6, 1e6)
        if t == F.TYPE_FLOAT:
            return rng.choice(FLOATS) if rng.random() < 0.7 else rng.uniform(-1e3, 1e3)
        if t == F.TYPE_STRING:
            return self._string(fd)
        if t == F.TYPE_BYTES:
            n = min(rng.choice([0, 1, 16, 300, 70_000]), max(0, self.budget))
            self.budget -= n
            return rng.randbytes(n)
        if t == F.TYPE_ENUM:
            values = [v.number for v in fd.enum_type.values]
            return rng.choice(values) if rng.random() < 0.8 else rng.choice([99, -1, 2**31 - 1])
        return self._int(fd)

    # ------------------------------------------------------------------ messages
    def fill(self, message: Any, depth: int = 0) -> Any:
        """Set a random subset of `message`'s fields to adversarial values (recursively, bounded depth)."""
        rng = self.rng
        desc: Descriptor = message.DESCRIPTOR
        if desc.full_name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
            self._plausible_time(message) if self.plausible else self._time(message)
            return message
        p_set = (0.95 if depth < 2 else 0.8) if self.plausible else (0.6 if depth < 2 else 0.3)
        for fd in desc.fields:
            if rng.random() > p_set:
                continue
            try:
                self._set_field(message, fd, depth)
            except (ValueError, TypeError, OverflowError):
                pass  # a value the Python runtime itself refuses to hold (e.g. out of float range)
        return message

    def _time(self, message: Any) -> None:
        rng = self.rng
        seconds = rng.choice([NOW_S, NOW_S - 3600, NOW_S + 3600, NOW_S - 86_400 * 30, 0, -1, 1, 2**31, 2**32 + 5,
                              -62_135_596_800, 253_402_300_799, 2**62, -(2**62), NOW_S + 86_400 * 365 * 100,
                              NOW_S - rng.randint(0, 86_400 * 30)])
        if message.DESCRIPTOR.full_name == "google.protobuf.Duration":
            seconds = rng.choice([0, 1, -1, 60, 3600, 86_400, 315_576_000_000, 2**40, -(2**40)])
        message.seconds = seconds
        if rng.random() < 0.2:
            message.nanos = rng.choice([0, 1, 999_999_999, -1, 2**31 - 1, -(2**31)])

    def _set_field(self, message: Any, fd: FieldDescriptor, depth: int) -> None:
        rng = self.rng
        is_map = fd.message_type is not None and fd.message_type.GetOptions().map_entry
        if is_map:
            container = getattr(message, fd.name)
            key_fd, value_fd = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
            for _ in range(rng.choice([0, 1, 2, 3])):
                key = self._scalar(key_fd)
                if value_fd.type == F.TYPE_MESSAGE:
                    if depth < 4:
                        self.fill(container[key], depth + 1)
                else:
                    container[key] = self._scalar(value_fd)
            return
        if _is_repeated(fd):
            container = getattr(message, fd.name)
            if self.plausible:
                n = rng.choice([1, 1, 2, 3, 24])
            else:
                n = rng.choice([0, 1, 1, 2, 3, 5]) if rng.random() < 0.95 else rng.choice([200, 3000])
            n = min(n, max(0, self.budget // BUDGET_PER_ELEMENT))
            self.budget -= n * BUDGET_PER_ELEMENT
            for _ in range(n):
                if fd.type == F.TYPE_MESSAGE:
                    if depth >= 4:
                        break
                    self.fill(container.add(), depth + 1)
                else:
                    container.append(self._scalar(fd))
            return
        if fd.type == F.TYPE_MESSAGE:
            if depth < 4:
                sub = getattr(message, fd.name)
                sub.SetInParent()
                self.fill(sub, depth + 1)
            return
        setattr(message, fd.name, self._scalar(fd))

    # ------------------------------------------------------------------ wire-level cases
    def case(self, request_cls: type) -> tuple[str, bytes]:
        """One fuzz case for `request_cls`: (kind, serialized bytes)."""
        rng = self.rng
        self.budget = CASE_BUDGET
        roll = rng.random()
        if roll < 0.05:
            return "empty", b""
        if roll < 0.35:
            return "plausible", self.plausible_message(request_cls).SerializeToString()
        if roll < 0.55:
            message = self.plausible_message(request_cls)
            self._mutate_one(message)
            return "plausible+1", message.SerializeToString()
        if roll < 0.8:
            return "adversarial", self.fill(request_cls()).SerializeToString()
        good = self.plausible_message(request_cls).SerializeToString()
        kind = rng.choice(["truncated", "random", "wrong_wire_type", "bad_utf8", "unknown_field", "deep_nesting",
                           "bad_length", "oversized"])
        if kind == "truncated":
            if len(good) < 2:
                return "random", rng.randbytes(rng.randint(1, 32))
            return kind, good[: rng.randint(1, len(good) - 1)]
        if kind == "random":
            return kind, rng.randbytes(rng.randint(1, 64))
        if kind == "oversized":  # past any --max-message-bytes the harness sets: an unknown field of 1.1 MiB
            return kind, good + _varint(999 << 3 | 2) + _varint(OVERSIZED_BYTES) + b"x" * OVERSIZED_BYTES
        fields = list(request_cls.DESCRIPTOR.fields) or [None]
        fd = rng.choice(fields)
        number = fd.number if fd is not None else 1
        if kind == "wrong_wire_type":
            expected = _wire_type(fd) if fd is not None else 0
            wire = rng.choice([w for w in (0, 1, 2, 5) if w != expected])
            payload = {0: _varint(rng.choice([1, 2**63, 2**64 - 1])), 1: struct.pack("<d", math.nan),
                       2: _varint(3) + b"\xff\x00\x01", 5: struct.pack("<f", -1.0)}[wire]
            return kind, good + _varint(number << 3 | wire) + payload
        if kind == "bad_utf8":
            strings = [f for f in request_cls.DESCRIPTOR.fields if f.type == F.TYPE_STRING]
            target = rng.choice(strings).number if strings else number
            return kind, good + _varint(target << 3 | 2) + _varint(4) + b"\xff\xfe\xc3\x28"
        if kind == "unknown_field":
            return kind, good + _varint(rng.choice([999, 2**29 - 1]) << 3 | 0) + _varint(7)
        if kind == "deep_nesting":
            messages = [f for f in request_cls.DESCRIPTOR.fields if f.type == F.TYPE_MESSAGE]
            target = rng.choice(messages).number if messages else number
            inner = b""
            for _ in range(rng.choice([50, 120, 400])):
                inner = _varint(target << 3 | 2) + _varint(len(inner)) + inner
            return kind, inner
        # bad_length: a length-delimited field whose length runs past the end
        return kind, good + _varint(number << 3 | 2) + _varint(1_000_000) + b"abc"

    def plausible_message(self, request_cls: type) -> Any:
        self.plausible = True
        try:
            return self.fill(request_cls())
        finally:
            self.plausible = False

    def _mutate_one(self, message: Any, depth: int = 0) -> None:
        """Make one field (possibly nested) of a plausible message adversarial."""
        rng = self.rng
        set_fields = [fd for fd, _ in message.ListFields()]
        fd = rng.choice(set_fields or list(message.DESCRIPTOR.fields) or [None])
        if fd is None:
            return
        if (fd.type == F.TYPE_MESSAGE and depth < 3 and not _is_repeated(fd)
                and message.DESCRIPTOR.full_name not in ("google.protobuf.Timestamp", "google.protobuf.Duration")
                and rng.random() < 0.6):
            self._mutate_one(getattr(message, fd.name), depth + 1)
            return
        if (_is_repeated(fd) and fd.type == F.TYPE_MESSAGE and len(getattr(message, fd.name)) and depth < 3
                and not fd.message_type.GetOptions().map_entry and rng.random() < 0.6):
            self._mutate_one(rng.choice(list(getattr(message, fd.name))), depth + 1)
            return
        message.ClearField(fd.name)
        try:
            self._set_field(message, fd, depth)
        except (ValueError, TypeError, OverflowError):
            pass

    def stream(self, request_cls: type) -> tuple[str, list[bytes]]:
        """A client stream: 0 to 5 cases (kinds joined)."""
        n = self.rng.choice([0, 1, 2, 3, 5])
        cases = [self.case(request_cls) for _ in range(n)]
        return "+".join(k for k, _ in cases) or "no_messages", [b for _, b in cases]


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _wire_type(fd: FieldDescriptor) -> int:
    if _is_repeated(fd) and fd.type not in (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE):
        return 2  # packed
    if fd.type in (F.TYPE_DOUBLE, F.TYPE_FIXED64, F.TYPE_SFIXED64):
        return 1
    if fd.type in (F.TYPE_FLOAT, F.TYPE_FIXED32, F.TYPE_SFIXED32):
        return 5
    if fd.type in (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE):
        return 2
    return 0
