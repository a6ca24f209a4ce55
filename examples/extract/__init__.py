"""A single-turn task with partial credit: one field (a name, an order number, a city, a
date) extracted from a short made-up message."""
