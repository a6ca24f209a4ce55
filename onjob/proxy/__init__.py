"""The OpenAI-compatible front door: routes each request to an arm, forwards it to the
engine, answers in OpenAI's shape, and hands the exchange to the collector."""
