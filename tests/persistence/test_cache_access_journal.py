"""The cache-manager's access journal on both backends: ids in order, replay in batches, pruning."""

from __future__ import annotations

from greenserve.cache_manager import journal
from greenserve.v1 import cache_manager_pb2 as pb


def _events(n: int, start: int = 0) -> list[journal.Event]:
    return [journal.Event(f"p{i % 2}", f"{start + i:04x}", pb.ACCESS_KIND_STORE, tokens=16, size_bytes=4096,
                          conversation_id="c", time_s=1_700_000_000.0 + i) for i in range(n)]


def test_append_replay_prune(db_url: str, open_db) -> None:
    db = open_db(db_url, "cache_manager")
    assert journal.append(db, []) == [] and journal.last_id(db) == 0
    first = journal.append(db, _events(5))
    second = journal.append(db, _events(7, start=5))
    ids = first + second
    assert ids == sorted(ids) and len(set(ids)) == 12 and journal.last_id(db) == ids[-1]
    replayed = list(journal.replay(db, 0, batch=4))  # several batches
    assert [i for i, _ in replayed] == ids
    assert [e for _, e in replayed] == _events(5) + _events(7, start=5)
    assert [i for i, _ in journal.replay(db, ids[4])] == ids[5:]
    assert journal.prune(db, ids[4]) == 5
    assert [i for i, _ in journal.replay(db, 0)] == ids[5:]
    assert journal.append(db, _events(1, start=99))[0] > ids[-1]  # ids never reused after a prune


def test_ids_keep_growing_after_everything_was_pruned(db_url: str, open_db) -> None:
    """Checkpoints hold journal ids: an id handed out again would be skipped at replay (lost)."""
    db = open_db(db_url, "cache_manager")
    ids = journal.append(db, _events(3))
    assert journal.prune(db, ids[-1]) == 2  # the newest stays
    with db.session() as s:  # even with every row gone (by hand), no id comes back
        s.execute(journal.delete(journal.AccessEvent))
        s.commit()
    assert journal.append(db, _events(1, start=50))[0] > ids[-1]
