"""A single-turn task the base model rambles on: the language spoken in a country, said
plainly."""
