"""The PostgreSQL connector: ``Sinks.postgres`` (see docs/postgres.md)."""
