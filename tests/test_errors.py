"""hpccollect's errors survive pickling with their type, message and attributes, also in a fresh
process that never made the ``with_builtin``/``as_worker_error`` variant it unpickles (a queue
read in a spawned child, a pool's or a job's result)."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from hpccollect import MultiSyncDataCollector
from hpccollect.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    CollectorTimeoutError,
    EnvError,
    HpcCollectError,
    PolicyError,
    StorageError,
    WorkerError,
    as_worker_error,
    with_builtin,
)

# Nothing at module level may make a variant: the spawned child imports this module, and must
# meet each variant first when it unpickles an error.

ATTRS = ("worker", "host", "remote_traceback", "num_workers", "rank", "env_name", "step", "code")
TRACEBACK = (
    "Traceback (most recent call last):\n  File \"env.py\", line 3, in step\nKeyError: 'x'\n"
)


class UserError(Exception):
    """A user's exception class, importable by module and name."""


def worker_kwargs(**extra: Any) -> dict[str, Any]:
    """Every ``WorkerError`` attribute, none left at its default."""
    return dict(worker=2, host="node-7", remote_traceback=TRACEBACK, num_workers=4, rank=3, **extra)


def class_names(cls: type) -> list[str]:
    """``cls``'s MRO as module-qualified names, comparable across processes."""
    return [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__]


def describe(err: BaseException) -> tuple[str, list[str], str, dict[str, Any]]:
    """What must survive pickling: class name, MRO, message and attributes."""
    attrs = {name: getattr(err, name) for name in ATTRS if hasattr(err, name)}
    return type(err).__name__, class_names(type(err)), str(err), attrs


def child_main(inbox: Any, outbox: Any, count: int) -> None:
    """In a spawned child: report the variants this process had before reading anything, then
    unpickle ``count`` errors from ``inbox`` and send back each one's ``describe``."""
    from hpccollect import errors

    outbox.put(sorted(c.__name__ for c in errors._RECIPES))
    for _ in range(count):
        try:
            outbox.put(("ok", describe(inbox.get(timeout=30))))
        except Exception as err:  # an error that does not unpickle here
            outbox.put(("failed", f"{type(err).__name__}: {err}"))


def reply(outbox: Any, child: Any, timeout: float = 45.0) -> Any:
    """The child's next message; fails at once when the child has died instead."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return outbox.get(timeout=0.5 if child.is_alive() else 2.0)
        except queue.Empty:
            if not child.is_alive():
                break
    pytest.fail(f"the child sent nothing back (exit code {child.exitcode})")


def through_fresh_child(errs: list[BaseException]) -> list[Any]:
    """``errs`` sent through a spawn-context ``Queue`` to a new process; its descriptions."""
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=child_main, args=(inbox, outbox, len(errs)), daemon=True)
    child.start()
    try:
        for err in errs:
            inbox.put(err)
        known_before = reply(outbox, child)
        got = [reply(outbox, child) for _ in errs]
        child.join(timeout=15)
        assert child.exitcode == 0, child.exitcode
    finally:
        if child.is_alive():
            child.kill()
            child.join(timeout=5)
        inbox.cancel_join_thread()  # never wait on a child that died before reading
        inbox.close()
        outbox.close()
    assert known_before == [], f"the child had variants before unpickling: {known_before}"
    return got


def worker_key_error() -> WorkerError:
    return as_worker_error(KeyError)("KeyError: 'obs'", **worker_kwargs())


def worker_user_error() -> WorkerError:
    err = as_worker_error(UserError)("UserError: odd", **worker_kwargs())
    err.code = 5  # attributes copied from the worker's exception
    return err


def worker_env_value_error() -> WorkerError:
    """What the collector raises for an env's ValueError: a variant of a variant."""
    cls = as_worker_error(with_builtin(EnvError, ValueError))
    err = cls("ValueError: bad action", **worker_kwargs())
    err.env_name, err.step = "Counter", 3
    return err


def storage_error_with_note() -> StorageError:
    err = StorageError("disk full writing run/shard-0003.h5")
    err.add_note("a note")  # __notes__ lives in __dict__: kept too
    return err


#: (id, a factory of the error, the classes it must still be); factories, so that importing this
#: module (as the spawned child does) makes no variant
SAMPLES: list[tuple[str, Callable[[], BaseException], tuple[type, ...]]] = [
    ("ArgumentTypeError", lambda: ArgumentTypeError("frames_per_batch: got str"), (TypeError,)),
    ("ArgumentValueError", lambda: ArgumentValueError("num_workers: got 0"), (ValueError,)),
    (
        "EnvError",
        lambda: EnvError("env broke", env_name="CartPole-v1", step=17),
        (RuntimeError,),
    ),
    ("PolicyError", lambda: PolicyError("action of shape (3,), expected (2,)"), (RuntimeError,)),
    ("StorageError", storage_error_with_note, (OSError,)),
    (
        "StorageError-errno",
        lambda: StorageError(28, "No space left on device", "run/shard.h5"),
        (OSError,),
    ),
    ("CollectorTimeoutError", lambda: CollectorTimeoutError("no reply in 5 s"), (TimeoutError,)),
    (
        "WorkerError",
        lambda: WorkerError("killed by signal SIGKILL", **worker_kwargs()),
        (RuntimeError,),
    ),
    (
        "WorkerError-defaults",
        lambda: WorkerError("died", worker=0, host="h"),
        (RuntimeError,),
    ),
    (
        "PolicyValueError",
        lambda: with_builtin(PolicyError, ValueError())("policy raised"),
        (PolicyError, ValueError),
    ),
    ("WorkerKeyError", worker_key_error, (WorkerError, KeyError, LookupError)),
    ("WorkerUserError", worker_user_error, (WorkerError, UserError)),
    ("WorkerEnvValueError", worker_env_value_error, (WorkerError, EnvError, ValueError)),
]


def assert_same(got: tuple, err: BaseException) -> None:
    name, mro, text, attrs = got
    assert (name, mro, text) == describe(err)[:3]
    assert attrs == describe(err)[3]


# ---------------------------------------------------------------------- in this process
@pytest.mark.parametrize(("make", "bases"), [s[1:] for s in SAMPLES], ids=[s[0] for s in SAMPLES])
def test_an_error_pickles_with_its_type_message_and_attributes(make, bases):
    err = make()
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(err, protocol))
        assert type(back) is type(err) and isinstance(back, HpcCollectError)
        assert isinstance(back, bases), type(back).__mro__
        assert str(back) == str(err) and back.args == err.args
        assert vars(back) == vars(err)


def test_a_worker_error_is_formatted_once():
    err = WorkerError("boom", **worker_kwargs())
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and str(back).count("Rank 3 (worker 2) on node-7: ") == 1
    assert str(back).count("--- traceback in rank 3 (worker 2) of 4 on node-7 ---") == 1
    assert back.remote_traceback == TRACEBACK and TRACEBACK.rstrip() in str(back)


def test_a_traceback_and_cause_are_dropped_but_the_remote_traceback_is_kept():
    try:
        try:
            raise KeyError("obs")
        except KeyError as cause:
            raise as_worker_error(KeyError)("KeyError: 'obs'", **worker_kwargs()) from cause
    except WorkerError as err:
        back = pickle.loads(pickle.dumps(err))
    assert back.__cause__ is None and back.__traceback__ is None
    assert back.remote_traceback == TRACEBACK


def test_a_class_pickle_cannot_name_falls_back_to_its_nearest_named_base():
    class LocalError(Exception):
        pass

    class LocalEnvError(EnvError):
        pass

    err = as_worker_error(LocalError)("LocalError: odd", **worker_kwargs())
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is WorkerError
    assert str(back) == str(err) and vars(back) == vars(err)

    env = LocalEnvError("env broke", env_name="E", step=1)
    back = pickle.loads(pickle.dumps(env))
    assert type(back) is EnvError and (str(back), back.env_name, back.step) == ("env broke", "E", 1)

    # a variant of a variant of a local class: the variant of what can be named
    err = as_worker_error(with_builtin(LocalEnvError, KeyError))("KeyError: 'k'", **worker_kwargs())
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is WorkerError and str(back) == str(err)


def test_copy_and_deepcopy_keep_the_attributes():
    import copy

    err = as_worker_error(KeyError)("KeyError: 'obs'", **worker_kwargs())
    for back in (copy.copy(err), copy.deepcopy(err)):
        assert type(back) is type(err) and str(back) == str(err) and vars(back) == vars(err)


# ---------------------------------------------------------------------- in a fresh process
@pytest.mark.timeout(60)
def test_errors_unpickle_in_a_fresh_spawned_process():
    samples = [(make(), bases) for _, make, bases in SAMPLES]
    got = through_fresh_child([err for err, _ in samples])
    for (err, bases), (status, description) in zip(samples, got):
        assert status == "ok", f"{type(err).__name__}: {description}"
        assert_same(description, err)
        mro = description[1]
        assert all(class_names(base)[0] in mro for base in bases), (bases, mro)


def failing_env() -> Any:
    """An env factory that fails in the worker, as a missing map file would."""
    raise ValueError("no map named level-1 on purpose")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_an_error_raised_by_a_real_worker_unpickles_in_a_fresh_process():
    with pytest.raises(WorkerError, match="Worker 0 on .*no map named level-1") as info:
        MultiSyncDataCollector([failing_env], None, frames_per_batch=4)
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, EnvError), type(err).__mro__
    assert err.worker == 0 and err.num_workers == 1 and err.host == socket.gethostname()
    assert "in failing_env" in err.remote_traceback

    [(status, description)] = through_fresh_child([err])
    assert status == "ok", description
    assert_same(description, err)
    assert {"builtins.ValueError", "hpccollect.errors.WorkerError"} <= set(description[1])
    assert "hpccollect.errors.EnvError" in description[1]
    assert "in failing_env" in description[3]["remote_traceback"]
