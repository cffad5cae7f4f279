"""``_exit.py``'s MPI job end: ``unlink_node_segment`` on real mappings of this process, and an
abort's wait for the launcher to read what this process wrote."""

from __future__ import annotations

import fcntl
import mmap
import os
import sys
import termios
import threading
import uuid
from pathlib import Path

import pytest

from hpccollect._exit import _drain_output, unlink_node_segment


def _mapped(path: bytes | str) -> mmap.mmap:
    with open(path, "w+b") as f:
        f.write(b"\0" * 4096)
        f.flush()
        return mmap.mmap(f.fileno(), 4096)


def test_the_node_segment_is_unlinked_beside_a_file_named_in_bytes_that_are_not_utf8(tmp_path):
    """The segment's name goes and its mapping stays; a mapped file whose path is not UTF-8
    (any path may be) does not stop it (reading /proc/self/maps as text raised)."""
    segment = f"/dev/shm/mpich_shm_hpccollect_test_{uuid.uuid4().hex}"
    odd = os.fsencode(tmp_path) + b"/odd-\xff\xfe"
    mappings = [_mapped(odd), _mapped(segment)]
    try:
        unlink_node_segment()
        assert not Path(segment).exists()
        mappings[1][:4] = b"kept"  # the mapping lives on
        assert os.path.exists(odd)
    finally:
        for m in mappings:
            m.close()
        if Path(segment).exists():
            os.unlink(segment)


@pytest.mark.timeout(30)
def test_an_abort_waits_until_the_launcher_has_read_what_this_process_wrote(monkeypatch):
    """``abort_job`` first lets the launcher read this process's stderr pipe (hydra dropped the
    message that said why the job ended); the wait ends once the pipe is empty, or is bounded
    when nobody reads it."""

    def unread(fd: int) -> int:
        count = bytearray(4)
        fcntl.ioctl(fd, termios.FIONREAD, count)
        return int.from_bytes(count, sys.byteorder)

    read_end, write_end = os.pipe()
    try:
        with os.fdopen(os.dup(write_end), "w") as stream:
            monkeypatch.setattr("sys.stderr", stream)
            stream.write("hpccollect: collector ranks [2] were lost\n")  # buffered: it flushes
            # the launcher comes late: an abort that did not wait would leave the line unread
            reader = threading.Timer(0.3, os.read, (read_end, 1 << 16))
            reader.start()
            _drain_output(timeout=10.0)
            assert unread(write_end) == 0
            reader.join(5)
            stream.write("nobody reads this\n")
            _drain_output(timeout=0.2)  # returns, bounded
            assert os.read(read_end, 1 << 16) == b"nobody reads this\n"
    finally:
        os.close(read_end)
        os.close(write_end)
