"""A single-turn task scored exactly: the capital of a country, named alone."""
