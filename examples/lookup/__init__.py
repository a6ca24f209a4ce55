"""A multi-turn tool-using task: an item's stock, found with a `lookup` tool."""
