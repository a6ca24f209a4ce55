"""The trainer: its GRPO step, a whole run against another revision, a training job's
start, the offline learning benchmark, and serving beside training."""
