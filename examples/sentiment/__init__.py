"""A single-turn classification task with partial credit: a made-up product review's
sentiment, positive, negative or neutral, named alone."""
