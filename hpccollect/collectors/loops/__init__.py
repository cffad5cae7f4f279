"""The step loops: env and policy stepped into batch buffers (gymnasium and TorchRL envs),
the policy's side of a step, trajectory ids, whole trajectories, and where batches go
(replay buffers, policy versions)."""
