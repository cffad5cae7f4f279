"""What one control message costs on this machine: a ping-pong of small frames between two
processes over a TCP loopback connection (what a collector rank's control link is) and over a
Unix socket, each side's CPU and the round trip's wall time.

Every batch of ``DistributedDataCollector(sync=False)`` costs two control frames (rank 0's
``COLLECT``, the rank's ``BATCH``). A Unix socket for the ranks on rank 0's host was tried
(2026-12-08): it saved a third of a frame's cost here, but rank 0's CPU per small batch in
``benchmarks/ingest.py`` did not move beyond the noise (74-78 against 75-84 us over mpi4py,
97-109 against 96-104 over gloo, three runs each, alternating), so the link stays TCP: what a
small batch costs rank 0 is mostly Python, not the frame's syscalls.

    python benchmarks/control_socket.py [--messages 20000] [--bytes 30] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import time


def _pair(kind: str) -> tuple[socket.socket, socket.socket]:
    """Two connected stream sockets of ``kind`` ("tcp": over loopback, "unix": abstract)."""
    if kind == "tcp":
        with socket.create_server(("127.0.0.1", 0)) as server:
            near = socket.create_connection(server.getsockname())
            far, _ = server.accept()
        for end in (near, far):
            end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return near, far
    name = f"\0hpccollect-bench-{os.getpid()}"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(name)
        server.listen()
        near = socket.socket(socket.AF_UNIX)
        near.connect(name)
        far, _ = server.accept()
    return near, far


def ping_pong(kind: str, messages: int, size: int) -> tuple[float, float]:
    """(wall us per round trip, this side's CPU us per round trip) over ``messages`` trips."""
    near, far = _pair(kind)
    pid = os.fork()
    if pid == 0:  # the echo side
        near.close()
        while data := far.recv(4096):
            far.sendall(data)
        os._exit(0)
    far.close()
    message = b"x" * size
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(messages):
            near.sendall(message)
            got = 0
            while got < size:
                got += len(near.recv(4096))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        near.close()
        os.waitpid(pid, 0)
    return wall / messages * 1e6, cpu / messages * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--bytes", type=int, default=30, help="a control frame's size (FRAME.size)")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    for _ in range(args.rounds):
        for kind in ("tcp", "unix"):
            wall, cpu = ping_pong(kind, args.messages, args.bytes)
            print(f"{kind:4s}: round trip {wall:6.1f} us wall, {cpu:5.1f} us CPU on one side")


if __name__ == "__main__":
    main()
