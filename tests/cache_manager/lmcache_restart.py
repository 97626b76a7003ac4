"""Controlled restart of a test LMCache server with a new L1 size (the --lmcache-restart-command of the tests).

Kills the process in PIDFILE, starts `lmcache server` again on the same ports with --l1-size-gb SIZE, writes
the new pid, waits for /healthcheck. Runs with any python (only the standard library).
Usage: python lmcache_restart.py PIDFILE LMCACHE_BIN HTTP_PORT RPC_PORT LOGFILE SIZE_GB [SERVER_ARGS...]
(SERVER_ARGS, e.g. --l2-adapter JSON, are passed on to `lmcache server`.)
"""

import os
import signal
import subprocess
import sys
import time
import urllib.request


def main() -> int:
    pidfile, lmcache, http_port, rpc_port, logfile, size_gb = sys.argv[1:7]
    old = int(open(pidfile).read())
    try:
        os.kill(old, signal.SIGTERM)
    except ProcessLookupError:
        pass
    for _ in range(100):
        try:
            os.kill(old, 0)
            time.sleep(0.1)
        except ProcessLookupError:
            break
    proc = subprocess.Popen([lmcache, "server", "--l1-size-gb", size_gb, "--eviction-policy", "LRU",
                             "--http-port", http_port, "--port", rpc_port, "--supported-transfer-mode", "auto",
                             *sys.argv[7:]],
                            stdout=open(logfile, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1"})
    open(pidfile, "w").write(str(proc.pid))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthcheck", timeout=1) as r:
                if r.status == 200:
                    return 0
        except OSError:
            time.sleep(0.3)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
