"""The schema of the first release (commit ef84b57), which created its tables with create_all.

A database made by that release has these tables and no `alembic_version`: benchlab stamps it at
this revision and upgrades from here (backend/db.py).

Revision ID: 0001
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweep",
        sa.Column("suite", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=True),
        sa.Column("params", sa.JSON(), nullable=True),
        sa.Column("tags", sa.JSON(), nullable=True),
        sa.Column("repeats", sa.Integer(), nullable=False),
        sa.Column("queue", sa.String(), nullable=False),
        sa.Column("timeout_s", sa.Float(), nullable=True),
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("uid", sa.String(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("cancelled_at", sa.Float(), nullable=True),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("fresh_process", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_sweep_suite", "sweep", ["suite"])
    op.create_index("ix_sweep_uid", "sweep", ["uid"])
    op.create_index("ix_sweep_created_at", "sweep", ["created_at"])
    op.create_table(
        "environment",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("digest", sa.String(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_environment_digest", "environment", ["digest"], unique=True)
    op.create_table(
        "job",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("sweep_id", sa.Integer(), sa.ForeignKey("sweep.id"), nullable=False),
        sa.Column("cell_index", sa.Integer(), nullable=False),
        sa.Column("repeat_index", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=True),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(), nullable=True),
        sa.Column("progress", sa.String(), nullable=True),
        sa.Column("error", sa.String(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("env_id", sa.Integer(), sa.ForeignKey("environment.id"), nullable=True),
    )
    op.create_index("ix_job_sweep_id", "job", ["sweep_id"])
    op.create_index("ix_job_state", "job", ["state"])
    op.create_table(
        "result",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("job.id"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("artifacts", sa.JSON(), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("env_id", sa.Integer(), sa.ForeignKey("environment.id"), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_result_job_id", "result", ["job_id"])


def downgrade() -> None:
    for table in ("result", "job", "environment", "sweep"):
        op.drop_table(table)
