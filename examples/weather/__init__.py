"""A multi-turn task with two tools: a made-up town's temperature, found with
`find_city` then `forecast`."""
