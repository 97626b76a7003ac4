"""ReportAccesses holds a bounded amount of memory per stream, whatever the size of its messages (audit)."""

from __future__ import annotations

import pytest

from greenserve.cache_manager.journal import MAX_EVENT_BYTES, read_stream
from greenserve.common.errors import InvalidArgument
from greenserve.v1 import cache_manager_pb2 as pb
from greenserve.v1 import common_pb2


async def test_an_oversized_event_is_refused_before_the_rest_is_read() -> None:
    """read_stream kept every message of the stream (up to 20,000) before any was checked, and a message may be as
    large as --max-message-bytes (16 MiB): a field far past its range, or unknown fields, which the checks never
    look at. One stream could make the service hold 20,000 x 16 MiB. A message larger than any valid event
    (MAX_EVENT_BYTES) is now refused as it arrives, naming it, and the stream is read no further."""
    sent = 0

    async def big(unknown: bool):
        nonlocal sent
        while True:
            sent += 1
            msg = pb.ReportAccessesRequest(pool="p", entry_key="ab", kind=pb.ACCESS_KIND_STORE, tokens=1,
                                           size_bytes=1)
            if unknown:  # a valid event carrying an unknown field of 1 MiB (field 99, length-delimited)
                msg.ParseFromString(msg.SerializeToString() + b"\x9a\x06\x80\x80\x40" + b"x" * (1 << 20))
            else:
                msg.conversation_id = "c" * (1 << 20)
            yield msg

    for unknown in (False, True):
        sent = 0
        with pytest.raises(InvalidArgument) as exc:
            await read_stream(big(unknown))
        assert exc.value.field == "events[0]" and sent == 1, (unknown, sent)


async def test_the_largest_valid_event_fits() -> None:
    """Every field at the end of its documented range (4-byte characters in the ids) is under MAX_EVENT_BYTES."""
    wide = "\U0001F600"
    msg = pb.ReportAccessesRequest(pool="p" * 128, entry_key="a" * 512, kind=pb.ACCESS_KIND_STORE, tokens=1 << 24,
                                   size_bytes=1 << 50, hit_tokens=1 << 24, conversation_id=wide * 256,
                                   document_id=wide * 256, turn=1_000_000, tier=max(common_pb2.CacheTier.values()))
    msg.time.seconds, msg.time.nanos = 4_102_444_800, 999_999_999
    assert msg.ByteSize() <= MAX_EVENT_BYTES

    async def one():
        yield msg

    assert len(await read_stream(one())) == 1
