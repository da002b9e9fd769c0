"""Models, migrations and the few queries the other layers need."""
