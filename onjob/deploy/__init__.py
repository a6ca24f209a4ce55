"""The release machinery: which checkpoint serves each alias, and the evidence that moves it.

The checkpoint registry (`registry`), loading adapters into the engine (`adapters`), the
routing log (`deployments`) and the operator that applies it (`operator`), paired
comparisons (`compare`, `canary`) with their statistics (`stats`), the admin API
(`admin`), and the periodic loop that re-samples, judges, trains, canaries and decides
(`loop`). It drives `judge` and `trainer` through their public functions and the
trainer's child process; it never imports torch.
"""
