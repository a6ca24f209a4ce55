"""onjob: an OpenAI-compatible proxy that learns from production traffic."""

__version__ = "0.1.0"
