"""A user's own training code, shipped with the examples (see train.py)."""
