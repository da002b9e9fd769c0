"""The REST API, the worker, the dashboard, the client and the CLI of kernelsearch."""
