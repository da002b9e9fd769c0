"""Part of the corpus package's deep vendor path."""
