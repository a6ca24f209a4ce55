"""A single-turn task with partial credit: the plural of an English noun, said plainly."""
