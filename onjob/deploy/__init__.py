"""The composition root and operator: engines, CLI, and (later) registry, canary and the loop.

Nothing imports `deploy`; it imports the other packages and wires them together.
"""
