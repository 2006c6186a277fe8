"""Alembic environment: benchlab passes its engine's connection in `config.attributes["connection"]`
(see backend/db.py), so migrations run on exactly the database the API uses."""
from __future__ import annotations

from alembic import context

from backend import models  # registers the tables on SQLModel.metadata

target_metadata = models.SQLModel.metadata


def run() -> None:
    connection = context.config.attributes["connection"]
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")  # SQLite alters tables by copying
    with context.begin_transaction():
        context.run_migrations()


run()
