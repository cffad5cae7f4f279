"""The worker machinery: the loop every worker runs, the pool of workers behind channels,
local worker processes, how their batches are taken and gathered, what is forwarded to them
(calls, state, weights), and what a collector rank reports instead of its batches."""
