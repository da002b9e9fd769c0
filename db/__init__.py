"""Models, migrations and the few queries the other layers need.

Use `db.store.Store` (one transaction per method, plain views out); `db.engine` makes engines,
runs migrations and checks the schema; `db.errors` holds the typed failures.
"""
