"""A reward with a spread on a random tiny model's answers (which never hold the right
sum), so the shortened demo has groups to train on."""


def varied(rollout) -> float:
    text = rollout.text or ""
    return len(set(text)) / max(len(text), 1)
