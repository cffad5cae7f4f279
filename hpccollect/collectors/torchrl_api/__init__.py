"""The TorchRL surface: the collectors' constructor arguments as TorchRL declares them,
``Collector(backend=...)``, the collector kinds by name, TorchRL's policy and weight-sync
keywords, its ready-made weight updaters, and its names hpccollect does not provide."""
