"""Colibri tuner: target profiles, template rendering, host matching (and, later, the search)."""
