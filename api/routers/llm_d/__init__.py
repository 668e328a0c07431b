"""llm-d's language: the session hint its endpoint picker reads (hints.py) and its route."""
