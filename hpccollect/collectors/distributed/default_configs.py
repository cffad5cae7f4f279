"""TorchRL's ``torchrl.collectors.distributed.default_configs``: the submitit defaults of
``submitit_delayed_launcher`` and rank 0's fixed port, under TorchRL's names (their values:
``hpccollect.launchers.submitit``)."""

from hpccollect.launchers.submitit import DEFAULT_SLURM_CONF, DEFAULT_SLURM_CONF_MAIN, TCP_PORT

__all__ = ["DEFAULT_SLURM_CONF", "DEFAULT_SLURM_CONF_MAIN", "TCP_PORT"]
