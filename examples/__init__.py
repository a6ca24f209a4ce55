"""Example agents: ordinary programs using the official `openai` client, pointed at onjob."""
