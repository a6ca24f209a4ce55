"""The dashboard `onjob serve` serves at /dashboard: traffic per alias and arm, the busiest
scenarios, groups with their members and the judge's explanations, conversations with
their tool calls, the learning curve and training runs, the running A/B comparison and
the deployments log. Server-rendered from the server's own database; behind the admin
key when one is set (the browser asks for it as a password); no asset from a CDN."""

from .pages import routes

__all__ = ["routes"]
