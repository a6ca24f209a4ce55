"""Owns the DuckDB database: exchanges stitched into trajectories and scenarios, and the
queries the other parts ask."""
