"""Search spaces (data) and the Optuna tuner that walks them."""
