"""TorchRL's policy keywords: ``policy_factory`` (the policy built where it runs) and
``compile_policy``/``cudagraph_policy`` (the policy wrapped for speed), checked once."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict.nn import CudaGraphModule, TensorDictModuleBase

from hpccollect.errors import ArgumentTypeError, ArgumentValueError

__all__ = [
    "check_compile",
    "check_cudagraph_device",
    "factories",
    "module_device",
    "policy_input_device",
    "wrap_for_speed",
]


def factories(
    policy: Any, policy_factory: Any, num_workers: int, with_policy: bool = False
) -> list[Callable] | None:
    """One policy constructor per worker (a callable given once is used by every worker), or
    None without ``policy_factory``. A policy and a factory together are refused, as in TorchRL
    (the factory builds the policy where it runs; weights then travel as a TensorDict), unless
    ``with_policy`` (TorchRL's ``weight_sync_schemes``: the policy here is the weights' source)."""
    if policy_factory is None:
        return None
    if policy is not None and not with_policy:
        raise ArgumentTypeError(
            "policy_factory cannot be used with policy: pass the policy, or a factory that "
            "builds it in each worker (and send weights with update_policy_weights_(weights))."
        )
    items = list(policy_factory) if isinstance(policy_factory, (list, tuple)) else None
    if items is None:
        items = [policy_factory] * num_workers
    elif len(items) != num_workers:
        raise ArgumentValueError(
            f"policy_factory lists {len(items)} constructors for {num_workers} workers; give one "
            "per worker, or one callable for all."
        )
    for item in items:
        if not callable(item):
            raise ArgumentTypeError(
                f"policy_factory must be a callable taking no argument that returns the policy "
                f"(or a list of them), got {type(item).__name__}."
            )
    return items


def check_compile(name: str, value: Any) -> dict[str, Any] | None:
    """``compile_policy``/``cudagraph_policy``: None or False (off), True (on, default options),
    or a mapping of options for ``torch.compile``/``CudaGraphModule``."""
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    raise ArgumentTypeError(
        f"{name} must be True, False, None or a dict of options, got {type(value).__name__}."
    )


def check_cudagraph_device(
    cudagraph_options: dict[str, Any] | None,
    device: torch.device | None,
    cuda: bool | None = None,
) -> None:
    """Refuse ``cudagraph_policy`` for a policy whose input is not on CUDA, on a machine with CUDA.

    A CUDA graph records CUDA work only: tensordict's ``CudaGraphModule`` refuses a policy input
    off CUDA at the first step, deep in the rollout. Said here, at construction, with the
    keyword that fixes it. Without CUDA (``cuda`` False; default: ``torch.cuda.is_available()``)
    the module calls the policy as is, so any device goes.

    Args:
        cudagraph_options: the checked ``cudagraph_policy`` (None when off).
        device: where the policy's input is (``policy_input_device``); None: not known yet (a
            worker's env is built in the worker, which checks again), nothing is refused.
        cuda: whether CUDA is usable here.

    Raises:
        ArgumentValueError: CUDA is usable and the policy's input is elsewhere.
    """
    if cudagraph_options is None or device is None:
        return
    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda and device.type != "cuda":
        raise ArgumentValueError(
            f"cudagraph_policy records the policy in a CUDA graph, which holds CUDA work only, "
            f"but the policy's input is on {device}: pass policy_device='cuda' (or "
            "device='cuda'), or leave cudagraph_policy off."
        )


def policy_input_device(
    policy_device: torch.device | None, env_device: torch.device | None, torchrl_env: bool
) -> torch.device:
    """Where the collector hands the policy its input: ``policy_device`` when given (the input is
    moved there); else where a TorchRL env gives its data, as TorchRL's collector leaves it; a
    gymnasium env's steps are built on the CPU. The policy's own parameters do not count (TorchRL
    moves nothing to them either).

    Args:
        policy_device: the resolved ``policy_device`` (None: not given).
        env_device: the env's device (a TorchRL env's; None: the CPU).
        torchrl_env: whether the env is a TorchRL env.

    Returns:
        The input's device.
    """
    if policy_device is not None:
        return policy_device
    if torchrl_env and env_device is not None:
        return torch.device(env_device)
    return torch.device("cpu")


def wrap_for_speed(
    module: TensorDictModuleBase,
    compile_options: dict[str, Any] | None,
    cudagraph_options: dict[str, Any] | None,
    device: torch.device | None,
) -> Callable:
    """The policy as the step loop calls it: compiled with ``torch.compile`` after ``warmup``
    eager calls (default 1), then captured in a ``CudaGraphModule`` (on a machine without CUDA
    it calls the module as is), as TorchRL's collector wraps it."""
    call: Callable = module
    if compile_options is not None:
        call = _Warmed(module, **compile_options)
    if cudagraph_options is not None:
        call = CudaGraphModule(call, in_keys=[], out_keys=[], device=device, **cudagraph_options)
    return call


def module_device(module: Any) -> torch.device | None:
    """The device of a module's first parameter or buffer (None: it has none, or is no
    module)."""
    if not isinstance(module, torch.nn.Module):
        return None
    for tensor in [*module.parameters(), *module.buffers()]:
        return tensor.device
    return None


class _Warmed:
    """``torch.compile(module)`` used after the first ``warmup`` calls ran eagerly."""

    def __init__(self, module: Callable, warmup: int = 1, **options: Any) -> None:
        self.module, self.warmup, self.calls = module, int(warmup), 0
        self.compiled = torch.compile(module, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.calls < self.warmup:
            self.calls += 1
            return self.module(*args, **kwargs)
        return self.compiled(*args, **kwargs)
