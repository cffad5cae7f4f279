"""``transport/mpi_job_end.unlink_node_segment``, on real mappings of this process."""

from __future__ import annotations

import mmap
import os
import uuid
from pathlib import Path

from hpccollect.transport.mpi_job_end import unlink_node_segment


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
