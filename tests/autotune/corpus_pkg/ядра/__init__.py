"""Non-ASCII package of the corpus."""
