"""A multi-turn tool-using task: "What is A × B?" with a `multiply` tool."""
