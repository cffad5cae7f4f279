"""One vocabulary: the collector kinds and launchers the command line takes are the library's
own words, and the earlier spellings still work, with a warning."""

from __future__ import annotations

import warnings

import h5py
import pytest

from hpccollect import MultiaSyncDataCollector, MultiSyncDataCollector, SyncDataCollector
from hpccollect.app.cli import main
from hpccollect.app.config import COLLECTORS, LAUNCHERS, RunConfig, wants_mpi
from hpccollect.collectors.torchrl_api.kinds import COLLECTOR_KINDS, collector_kind
from hpccollect.distributed.arguments import check_collector_class
from hpccollect.errors import ArgumentValueError
from hpccollect.launchers import job_launchers


def test_the_command_line_uses_the_librarys_lists():
    assert COLLECTORS == tuple(COLLECTOR_KINDS) == ("single", "multi-sync", "multi-async")
    assert ("none", *job_launchers()) == LAUNCHERS


@pytest.mark.parametrize(
    "kind, cls",
    [
        ("single", SyncDataCollector),
        ("multi-sync", MultiSyncDataCollector),
        ("multi-async", MultiaSyncDataCollector),
    ],
)
def test_a_kind_names_one_class_everywhere(kind, cls):
    assert collector_kind(kind) is cls
    assert check_collector_class(kind) is cls  # collector_class="multi-sync" as --collector


def test_torchrls_collector_class_words_keep_torchrls_meaning():
    assert check_collector_class("sync") is MultiSyncDataCollector
    assert check_collector_class("async") is MultiaSyncDataCollector
    with pytest.raises(ArgumentValueError, match="collector kind must be one of"):
        collector_kind("sync")  # not a kind of the command line: it meant 'single' there


@pytest.mark.parametrize(
    "option, old, new", [("collector", "sync", "single"), ("launcher", "local", "none")]
)
def test_an_earlier_spelling_is_accepted_with_a_warning(option, old, new):
    with pytest.warns(FutureWarning, match=f"--{option} {old} is now spelled --{option} {new}"):
        cfg = RunConfig.from_sources({}, {option: old})
    assert getattr(cfg, option) == new
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(RunConfig.from_sources({option: new}, {}), option) == new


def test_launcher_none_runs_one_process_even_under_a_launcher(monkeypatch):
    monkeypatch.setenv("PMI_SIZE", "3")  # as mpiexec -n 3 sets it
    monkeypatch.setenv("PMI_RANK", "0")
    assert wants_mpi(RunConfig(launcher="none")) is False
    assert wants_mpi(RunConfig(launcher="mpi")) is True


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_collector_sync_on_the_command_line_still_runs_single(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["--collector", "sync", "--total-frames", "200", "--frames-per-batch", "100"]
    code = main([*argv, "--quiet", "--out", "x.h5"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "hpccollect: warning: --collector sync is now spelled --collector single" in err
    with h5py.File(tmp_path / "x.h5") as f:
        assert '"collector": "single"' in f.attrs["collector_config"]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--liveness-timeout", "0.5"], "--liveness-timeout must be a number of seconds >= 1"),
        (["--liveness-timeout", "nan"], "--liveness-timeout must be a number of seconds >= 1"),
        (["--liveness-timeout", "inf"], "--liveness-timeout must be a number of seconds >= 1"),
        (["--worker-timeout", "nan"], "--worker-timeout must be a number of seconds > 0"),
        (["--worker-timeout", "inf"], "--worker-timeout must be a number of seconds > 0"),
        (["--on-rank-failure", "continue"], "--on-rank-failure: only for a distributed run"),
        (["--liveness-timeout", "10"], "--liveness-timeout: only for a distributed run"),
        (["--report-interval", "0"], "--report-interval must be a number of seconds > 0"),
        (["--report-interval", "nan"], "--report-interval must be a number of seconds > 0"),
        (["--report-interval", "1"], "--report-interval sets how often a --shards rank"),
        (["--shards", "--report-interval", "1"], "--shards, --report-interval: only for a"),
    ],
)
def test_the_rank_failure_options_are_checked_in_one_line(
    tmp_path, monkeypatch, capsys, args, says
):
    monkeypatch.chdir(tmp_path)
    assert main(["collect", *args, "--out", "x.h5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hpccollect: error: {says}"), err
    assert not list(tmp_path.iterdir())


def test_on_rank_failure_takes_raise_or_continue(capsys):
    assert main(["collect", "--on-rank-failure", "maybe"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--on-rank-failure" in err[0] and "'maybe'" in err[0], err


@pytest.mark.parametrize(
    "name, value, says",
    [
        ("seed", True, "--seed must be an integer"),
        ("seed", 1.5, "--seed must be an integer"),
        ("policy", 3, "--policy must be a non-empty string"),
        ("out", 3, "--out must be a non-empty string"),
        ("resume", "", "--resume must be a non-empty string"),
        ("collector", 3, "--collector must be a non-empty string"),
        ("overwrite", 1, "--overwrite is true or false"),
        ("max_steps", True, "--max-steps must be a positive integer, got True"),
    ],
)
def test_a_config_of_the_wrong_type_is_refused_by_its_option(name, value, says):
    """What a TOML file can give that the command line cannot: each refused, named."""
    with pytest.raises(ArgumentValueError, match=says.replace("-", r"\-")):
        RunConfig(**{name: value})


def test_a_refused_run_or_read_leaves_no_folder_and_names_a_folder_given_as_a_file(
    tmp_path, monkeypatch, capsys
):
    """A run refused after its --out was checked leaves no directory it would have made; a
    folder given where a dataset goes is called a folder (was h5py's cut-off "file read
    failed" line)."""
    monkeypatch.chdir(tmp_path)
    assert main(["collect", "--out", "new/x.h5", "--policy", "nosuch"]) == 2
    assert not list(tmp_path.iterdir())
    (tmp_path / "runs").mkdir()
    for command in (["inspect", "runs"], ["export", "runs", "--format", "memmap", "--out", "m"]):
        capsys.readouterr()
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ["hpccollect: error: runs is a directory; give a dataset file in it."]
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["colect", "--total-frames", "100"], "unknown command 'colect'; did you mean 'collect'?"),
        (["CartPole-v1"], "unknown command 'CartPole-v1' (commands: collect, inspect, repair"),
        # the earlier spelling --collector sync is still taken, but not offered
        (["--collector", "foo"], "(choose from 'single', 'multi-sync', 'multi-async') (see"),
    ],
)
def test_a_mistaken_command_or_choice_says_what_there_is(tmp_path, monkeypatch, capsys, args, says):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not list(tmp_path.iterdir())
