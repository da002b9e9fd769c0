"""Models, migrations and the few queries the other layers need.

Use `db.store.Store` (one transaction per method, plain views out), or name the narrowest
protocol of `db.interfaces` it implements; `db.repos` holds one repository per concern,
`db.views` the values they take and give (the one record definition among them), `db.wire` the
records file format; `db.engine` makes engines, runs migrations and checks the schema;
`db.errors` holds the typed failures.
"""
