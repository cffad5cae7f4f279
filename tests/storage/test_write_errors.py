"""Write errors: a full disk (a real 1 MiB tmpfs) and a file-size limit (RLIMIT_FSIZE), in real
writer processes; the file keeps every committed row with its real values, and repair makes it
whole."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch

from hpccollect.errors import StorageError
from hpccollect.storage import HDF5Writer, open_dataset, repair

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

TESTS = str(Path(__file__).resolve().parent.parent)

WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from conftest import CounterEnv
    from hpccollect import SyncDataCollector
    from hpccollect.errors import StorageError
    from hpccollect.storage import HDF5Writer

    collector = SyncDataCollector(lambda: CounterEnv(7), None, frames_per_batch=500)
    writer = HDF5Writer({path!r}, fsync_every=2)
    if {unguarded!r}:  # take away the space reservation: HDF5 itself meets the full disk
        from hpccollect.storage.diskspace import SpaceReserver
        SpaceReserver.ensure = lambda self, end: None
    try:
        for batch in collector:
            writer.extend(batch)
            print(writer.committed_steps, flush=True)
    except StorageError as err:
        print(str(err), file=sys.stderr)
        sys.exit(2)
    finally:
        writer.close()
""")


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs, unmounted at the end."""
    unable = pytest.fail if os.environ.get("CI") else pytest.skip  # CI runs as root: no excuse
    if os.geteuid() != 0:
        unable("mounting a tmpfs needs root")
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)])
    if done.returncode:
        unable("cannot mount a tmpfs here")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def run_writer(path: Path, unguarded: bool = False, fsize: int | None = None):
    """Run the writer script until it stops: (return code, committed counts printed, stderr)."""
    script = WRITER.format(tests=TESTS, path=str(path), unguarded=unguarded)

    def limit():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.RLIM_INFINITY))

    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=150,
        preexec_fn=limit,
    )
    return done.returncode, [int(x) for x in done.stdout.split()], done.stderr


def assert_rows_are_what_counter_env_produced(path: Path, at_least: int) -> None:
    """Every committed row has its real values: CounterEnv(7) episodes are steps 0..6."""
    with open_dataset(path) as ds:
        assert not ds.complete
        assert ds.check() == []
        assert len(ds) >= at_least > 0
        data = ds.to_tensordict()
        obs = data["observation"].reshape(-1, 7)
        assert torch.equal(obs, torch.arange(7.0).expand_as(obs))
        assert torch.equal(data["next", "reward"].reshape(-1, 7), obs + 1)
        assert data["next", "terminated"].reshape(-1, 7)[:, -1].all()
        assert len(ds) == 7 * ds.committed_episodes


def assert_repair_makes_it_whole(partial: Path, committed: int) -> None:
    fixed = repair(partial)
    assert fixed == partial.with_name(partial.name.removesuffix(".partial"))
    assert not partial.exists()
    with open_dataset(fixed) as ds:
        assert ds.check() == [] and ds.complete
        assert len(ds) == ds.written_steps == committed


@pytest.mark.parametrize("unguarded", [False, True], ids=["reserved", "hdf5-fails"])
def test_full_disk_ends_with_one_line_and_keeps_every_committed_row(tiny_disk, unguarded):
    """``hdf5-fails``: without the space reservation HDF5 itself hits the full disk mid-write."""
    filler = tiny_disk / "filler"
    filler.write_bytes(b"x" * (192 << 10))
    path = tiny_disk / "full.h5"
    code, printed, err = run_writer(path, unguarded=unguarded)
    assert code == 2, err  # not a crash (-11, -7), not a traceback (1)
    line = err.strip()
    assert "\n" not in line, err
    assert line.startswith(f"cannot write {path}.partial: No space left on device"), line
    assert "repair" in line
    partial = tiny_disk / "full.h5.partial"
    assert partial.exists() and not path.exists()  # never marked complete
    assert_rows_are_what_counter_env_produced(partial, printed[-1])
    with open_dataset(partial) as ds:
        committed = len(ds)
    assert f"its {committed} committed rows" in line
    if unguarded:  # the disk is full to the last byte: repair says so and changes nothing
        with pytest.raises(StorageError, match=r"cannot repair .*No space left on device.*nothing"):
            repair(partial)
        assert_rows_are_what_counter_env_produced(partial, committed)
    filler.unlink()  # what the message says: free space, then repair
    assert_repair_makes_it_whole(partial, committed)


def test_file_size_limit_ends_with_one_line_and_keeps_every_committed_row(tmp_path):
    path = tmp_path / "big.h5"
    code, printed, err = run_writer(path, fsize=1_000_000)
    assert code == 2, err  # not killed by SIGXFSZ
    assert "\n" not in err.strip() and "File too large" in err, err
    partial = tmp_path / "big.h5.partial"
    assert partial.stat().st_size <= 1_000_000
    assert_rows_are_what_counter_env_produced(partial, printed[-1])
    with open_dataset(partial) as ds:
        committed = len(ds)
    assert_repair_makes_it_whole(partial, committed)


def test_repair_without_space_says_what_it_could_not_save(tiny_disk):
    """A repair that cannot write raises StorageError naming the file and the cause."""
    partial = tiny_disk / "ro.h5.partial"
    code, printed, _ = run_writer(tiny_disk / "ro.h5")
    assert code == 2
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_disk)], check=True)
    try:
        with pytest.raises(StorageError, match=rf"cannot repair {partial}: Read-only file system"):
            repair(partial)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(tiny_disk)], check=True)
    assert_rows_are_what_counter_env_produced(partial, printed[-1])  # untouched


def test_writer_on_a_read_only_disk_raises_storage_error(tiny_disk):
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_disk)], check=True)
    try:
        with pytest.raises(StorageError, match=r"cannot create .*Read-only file system"):
            HDF5Writer(tiny_disk / "x.h5")
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(tiny_disk)], check=True)


def test_full_disk_on_the_command_line_is_one_line_and_exit_1(tiny_disk, tmp_path):
    out = tiny_disk / "run.h5"
    env = {k: v for k, v in os.environ.items() if k != "HPCCOLLECT_DATA_DIR"}
    done = subprocess.run(
        [sys.executable, "-m", "hpccollect", "--collector", "single", "--env", "Pendulum-v1",
         "--total-frames", "40000", "--frames-per-batch", "2000", "--quiet", "--out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("hpccollect: failed")]
    assert len(lines) == 1 and "No space left on device" in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    partial = out.with_name(out.name + ".partial")
    with open_dataset(partial) as ds:
        assert not ds.complete and ds.check() == [] and len(ds) > 0
        rows = ds[:]
        assert torch.isfinite(rows["observation"]).all()
        assert (rows["observation"].abs().sum(-1) > 0).all()  # real rows, not zero fill
