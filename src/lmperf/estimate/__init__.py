"""Estimates for machines you may not have: time, memory and parallelism, in one vocabulary.

Nothing here runs the model on real data. `simulate` runs one step on phantom tensors (live
bytes over time, as MemTracker counts them); `shards` weights that timeline by what a rank of a
parallel strategy keeps; `op_costs` counts each op's FLOPs and bytes on fake tensors and
`time_model` turns them into time on a target; `formulas` holds the closed forms of parallel
training (states, activations, communication volume); `comm` the time of one collective;
`target` the device named by `--gpu NAME --gpus N --gib G`; `fit` the one answer to "does it
fit". `bench --predict`, `memory --estimate`, `dist --estimate` and `plan` are views of these.
"""
