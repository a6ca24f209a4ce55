"""Turns logged traffic into scored groups: re-sampling, RULER, reward functions, feedback."""
