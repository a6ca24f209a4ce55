"""The judge: what a RULER call costs on the local engine."""
