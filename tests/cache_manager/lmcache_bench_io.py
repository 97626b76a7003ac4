"""STORE or LOOKUP token sequences on a running `lmcache server` with LMCache's own bench client (CPU).

Runs with the LMCache virtualenv's python. The sequences are the bench client's deterministic ones
(`create_request(seq)`: 512 tokens, two 256-token chunks each), so a later LOOKUP of the same sequence ids asks
for the same objects; a LOOKUP makes the server prefetch hits from L2 into L1. Prints one JSON object:
{"results": [[hit_chunks, total_chunks] per sequence]} for lookup, {"stored": N} for store.

Usage: .venv-lmcache/bin/python tests/cache_manager/lmcache_bench_io.py store|lookup RPC_URL SEQUENCES
"""

from __future__ import annotations

import dataclasses
import json
import sys


def main() -> int:
    mode, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from lmcache.cli.commands.bench.server_bench.client import ServerBenchClient
    from lmcache.cli.commands.bench.server_bench.config import BenchConfig

    fields = {f.name for f in dataclasses.fields(BenchConfig)}
    values = dict(rpc_url=url, mode="cpu", transfer_mode="engine_driven", tp_size=1, use_mla=False, num_tokens=512,
                  kvcache_shape_spec="(2,64,16,2,64):float16:2", num_blocks=256, block_size=16, start=0, end=n,
                  interval=0.0, url="", http_url="http://127.0.0.1:1")
    client = ServerBenchClient(BenchConfig(**{k: v for k, v in values.items() if k in fields}),
                               log=lambda msg: print(msg, file=sys.stderr))
    client.start()
    results = []
    try:
        for seq in range(n):
            req = client.create_request(seq, f"{mode}-{seq}", mode)
            if mode == "store":
                if client.store(req, 0, req.num_full_tokens) is None:
                    return 1
            else:
                r = client.lookup(req)
                results.append([r.hit_chunks, r.total_chunks])
    finally:
        client.close()
    print(json.dumps({"stored": n} if mode == "store" else {"results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
