"""A single-turn task with partial credit: the one-word opposite of a common word."""
