"""Store KV chunks into a running `lmcache server` through LMCache's own MP client, on CPU.

Runs with the LMCache virtualenv's python (it imports lmcache), not greenserve's. It reuses the client of
`lmcache bench server` (ServerBenchClient, CPU mode: regular CPU KV tensors, engine-driven transfer, which
needs the server started with `--supported-transfer-mode auto`) to register a small CPU KV cache, then
STOREs `--sequences` token sequences of `--tokens` tokens under `--salt`, and prints one JSON object:
{"chunk_size", "model_name", "objects": [{"chunk_hash_hex", "model_name", "kv_rank", "object_group_id",
"cache_salt", "tokens"}, ...]} with the object keys the server derives, computed by LMCache's own code
(TokenHasher, blake3, and `ipc_key_to_object_keys`, which packs kv_rank = world_size << 24 | rank << 16 |
local_world_size << 8 | local_rank: 16777472 for this single worker, not 0).

Usage: .venv-lmcache/bin/python tests/cache_manager/lmcache_populate.py --rpc-url tcp://127.0.0.1:PORT
       --sequences 4 --tokens 512 --salt tenant-a --seed 1
"""

from __future__ import annotations

import argparse
import json
import random
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rpc-url", required=True)
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=512, help="tokens per sequence (multiple of the chunk size)")
    parser.add_argument("--salt", default="")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", default="(2,64,16,2,64):float16:2", help="KV shape spec (lmcache grammar)")
    args = parser.parse_args()

    from lmcache.cli.commands.bench.server_bench.client import ServerBenchClient
    from lmcache.cli.commands.bench.server_bench.config import BenchConfig
    from lmcache.cli.commands.bench.server_bench.helpers import _MODEL_NAME, _wait_for_result, _TIMEOUT
    from lmcache.v1.distributed.api import ipc_key_to_object_keys
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
    from lmcache.v1.multiprocess.token_hasher import TokenHasher

    import dataclasses

    fields = {f.name for f in dataclasses.fields(BenchConfig)}
    values = dict(rpc_url=args.rpc_url, mode="cpu", transfer_mode="engine_driven", tp_size=1, use_mla=False,
                  num_tokens=args.tokens, kvcache_shape_spec=args.shape, num_blocks=64, block_size=16,
                  start=0, end=args.sequences, interval=0.0, url="", http_url="http://127.0.0.1:1")
    config = BenchConfig(**{k: v for k, v in values.items() if k in fields})
    client = ServerBenchClient(config, log=lambda msg: print(msg, file=sys.stderr))
    client.start()
    try:
        chunk = client._chunk_size
        hasher = TokenHasher(chunk_size=chunk, hash_algorithm="blake3")
        worker = client._workers[0]
        rng = random.Random(args.seed)
        objects = []
        n_tokens = args.tokens - args.tokens % chunk
        blocks_needed = n_tokens // client._block_size
        for seq in range(args.sequences):
            tokens = tuple(rng.randrange(1, 30000) for _ in range(n_tokens))
            request_id = f"populate-{args.seed}-{seq}"
            key = IPCCacheServerKey(model_name=_MODEL_NAME, world_size=1, worker_id=0, token_ids=tokens,
                                    start=0, end=n_tokens, request_id=request_id, cache_salt=args.salt)
            block_ids = [list(range(0, blocks_needed))]
            event = worker.transfer_context.create_recorded_event()
            future = worker.transfer_context.submit_store(request_id, key, worker.kv_caches, block_ids, event,
                                                          client._blocks_in_chunk)
            reply = _wait_for_result(future, retain_refs=(event,) if event is not None else ())
            if reply is _TIMEOUT or not reply:
                print(f"STORE failed for sequence {seq}: {reply!r}", file=sys.stderr)
                return 1
            hashes = hasher.compute_chunk_hashes(list(tokens))
            for obj in ipc_key_to_object_keys(key, hashes, [0])[0]:
                enc = obj.to_encoded_object_key()
                objects.append({"chunk_hash_hex": enc.chunk_hash_hex, "model_name": enc.model_name,
                                "kv_rank": enc.kv_rank, "object_group_id": enc.object_group_id,
                                "cache_salt": enc.cache_salt, "tokens": chunk})
    finally:
        client.close()
    print(json.dumps({"chunk_size": chunk, "model_name": _MODEL_NAME, "objects": objects}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
