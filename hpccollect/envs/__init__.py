"""gymnasium environments as TensorDict-speaking envs with TorchRL's keys, dtypes and specs."""

from hpccollect.envs.factory import make_env
from hpccollect.envs.gym import GymEnv
from hpccollect.envs.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    OneHot,
    TensorSpec,
    Unbounded,
)

__all__ = [
    "Binary",
    "Bounded",
    "Categorical",
    "Composite",
    "GymEnv",
    "MultiCategorical",
    "MultiOneHot",
    "OneHot",
    "TensorSpec",
    "Unbounded",
    "make_env",
]
