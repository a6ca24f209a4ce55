"""The release decision: how often the rule is wrong, drift between what is tested and
served, noise per pair, and the whole-loop learning benchmark."""
