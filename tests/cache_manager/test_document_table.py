"""The cache index's table of document ids stays bounded by the entries it indexes (audit, issue 21's rule: memory
stays bounded however much input arrives)."""

from __future__ import annotations

import numpy as np

from greenserve.cache_manager import journal
from greenserve.common.cache_index.index import DOC_TABLE_MIN, CacheIndex
from greenserve.v1 import cache_manager_pb2 as pb

CAP = 100  # --index-max-entries


def _store(key: str, doc: str, t: float) -> journal.Event:
    return journal.Event("p", key, pb.ACCESS_KIND_STORE, tokens=16, size_bytes=4096, document_id=doc, time_s=t)


def test_document_ids_of_forgotten_entries_do_not_accumulate(tmp_path) -> None:
    """Every STORE naming a new document_id added it to the index's document table for good, even once the index
    (capped at --index-max-entries) had forgotten all its entries: a reporter sending new document ids grew the
    cache-manager by about 400 bytes per id without bound, and every checkpoint wrote them all."""
    index, history = CacheIndex(), journal.new_history(10)
    # a document with hits whose entry stays indexed (hit often): its reuse statistics must survive the bound
    journal.apply(index, 1, _store("keep", "kept-doc", 0.0), history, CAP)
    event_id, hits = 1, 0
    for i in range(3 * DOC_TABLE_MIN):
        event_id += 1
        journal.apply(index, event_id, _store(f"{i:08x}", f"doc-{i}", 10.0 + i), history, CAP)
        if i % 20 == 0:
            event_id += 1
            hits += 1
            journal.apply(index, event_id, journal.Event("p", "keep", pb.ACCESS_KIND_HIT, tokens=16,
                                                         document_id="kept-doc", time_s=10.0 + i), history, CAP)
    assert len(index) == CAP
    assert "keep" in index
    assert len(index._doc_slot_of) <= DOC_TABLE_MIN + 2 * CAP
    assert index._doc_hits[index.doc[index.slot("keep")]] == hits
    assert index._doc_accu[index.doc[index.slot("keep")]] == 16 * hits
    # every indexed entry's document is still known, under its own name
    names = {d: name for name, d in index._doc_slot_of.items()}
    live = np.flatnonzero(index.live)
    assert all(index.doc[s] >= 0 and names[int(index.doc[s])].startswith(("doc-", "kept-doc")) for s in live)
    # a checkpoint restores the same scores
    index.save(tmp_path / "p.npz")
    back = CacheIndex.load(tmp_path / "p.npz")
    assert back._doc_slot_of == index._doc_slot_of
    assert np.array_equal(back.value[: back._n], index.value[: index._n])
    # and keeps bounding after a load
    for i in range(3 * DOC_TABLE_MIN, 5 * DOC_TABLE_MIN):
        event_id += 1
        journal.apply(back, event_id, _store(f"{i:08x}", f"doc-{i}", 10.0 + i), history, CAP)
    assert len(back._doc_slot_of) <= DOC_TABLE_MIN + 2 * CAP
