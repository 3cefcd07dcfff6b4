"""tokenization."""
