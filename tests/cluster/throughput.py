#!/usr/bin/env python3
"""TCP helpers for tests/cluster/cluster_test.sh, run on the cluster's hosts with
`scripts/cluster_local.sh exec HOST python3 throughput.py ...`:

  recv ADDR PORT [TIMEOUT_S]   accept one connection, read it to its end, print
                               `mbit=R bytes=N seconds=T` (from the first byte to the end)
  send HOST PORT BYTES         connect (retrying for 10 s while the receiver starts),
                               send BYTES bytes, wait until the receiver closes
  listen ADDR PORT SECONDS     accept and close connections for SECONDS
  probe HOST PORT              exit 0 when a connection opens within 2 s, 1 when not
"""
import socket
import sys
import time

CHUNK = 64 * 1024


def recv(addr, port, timeout=30.0):
    with socket.create_server((addr, port)) as srv:
        srv.settimeout(timeout)
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(timeout)
            total, first = 0, None
            while True:
                data = conn.recv(CHUNK)
                if not data:
                    break
                if first is None:
                    first = time.monotonic()
                total += len(data)
            end = time.monotonic()
    seconds = max(end - (first or end), 1e-9)
    print(f"mbit={total * 8 / seconds / 1e6:.1f} bytes={total} seconds={seconds:.3f}", flush=True)


def connect(host, port, patience):
    deadline = time.monotonic() + patience
    while True:
        try:
            return socket.create_connection((host, port), timeout=2)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def send(host, port, nbytes):
    payload = b"\x5a" * CHUNK
    with connect(host, port, 10.0) as s:
        s.settimeout(60)
        left = nbytes
        while left > 0:
            n = min(left, CHUNK)
            s.sendall(payload[:n])
            left -= n
        s.shutdown(socket.SHUT_WR)
        while s.recv(CHUNK):
            pass


def listen(addr, port, seconds):
    with socket.create_server((addr, port)) as srv:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            srv.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                conn, _ = srv.accept()
                conn.close()
            except socket.timeout:
                break


def probe(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return 0
    except OSError:
        return 1


def main(argv):
    if len(argv) >= 3 and argv[0] == "recv":
        recv(argv[1], int(argv[2]), float(argv[3]) if len(argv) > 3 else 30.0)
    elif len(argv) == 4 and argv[0] == "send":
        send(argv[1], int(argv[2]), int(argv[3]))
    elif len(argv) == 4 and argv[0] == "listen":
        listen(argv[1], int(argv[2]), float(argv[3]))
    elif len(argv) == 3 and argv[0] == "probe":
        return probe(argv[1], int(argv[2]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
