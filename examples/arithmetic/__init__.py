"""A single-turn task with a checkable answer: "What is A + B?"."""
