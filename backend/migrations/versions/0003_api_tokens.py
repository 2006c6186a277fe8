"""Named API tokens: name, scope (read / write / admin), the SHA-256 of the secret, last use, revocation.

Revision ID: 0003
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_token",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("scope", sa.String(), nullable=False),
        sa.Column("token_hash", sa.String(), nullable=False),
        sa.Column("prefix", sa.String(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_used_at", sa.Float(), nullable=True),
        sa.Column("revoked_at", sa.Float(), nullable=True),
    )
    op.create_index("ix_api_token_name", "api_token", ["name"], unique=True)
    op.create_index("ix_api_token_token_hash", "api_token", ["token_hash"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_api_token_token_hash", table_name="api_token")
    op.drop_index("ix_api_token_name", table_name="api_token")
    op.drop_table("api_token")
