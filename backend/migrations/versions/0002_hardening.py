"""One result per attempt, non-finite metrics flagged, worker heartbeats, dead letters.

- result: (job_id, attempt) unique. A database from before may hold duplicates (a message
  delivered twice wrote two rows): the latest row of each pair is kept, as pages showed it.
- result.nonfinite: names of metrics that were NaN or inf and are stored as null.
- worker: the last heartbeat of each worker (the reaper finds jobs whose worker is gone).
- dead_letter: results-queue messages the recorder could not apply.

Revision ID: 0002
"""
from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _clean_nonfinite(conn) -> None:
    """Metrics stored with NaN or Infinity (SQLite took them; they are not JSON): null them, flag them."""
    from worker.contract import clean_metrics

    rows = conn.execute(sa.text("SELECT id, CAST(metrics AS TEXT) FROM result WHERE CAST(metrics AS TEXT) LIKE "
                                "'%Infinity%' OR CAST(metrics AS TEXT) LIKE '%NaN%'")).all()
    for rid, text in rows:
        metrics, bad = clean_metrics(json.loads(text or "{}"))
        if bad:
            conn.execute(sa.text("UPDATE result SET metrics = :m, nonfinite = :n WHERE id = :i"),
                         {"m": json.dumps(metrics), "n": json.dumps(bad), "i": rid})


def upgrade() -> None:
    op.execute("DELETE FROM result WHERE id NOT IN "
               "(SELECT MAX(id) FROM result GROUP BY job_id, attempt)")
    with op.batch_alter_table("result") as batch:
        batch.add_column(sa.Column("nonfinite", sa.JSON(), nullable=True))
        batch.create_unique_constraint("uq_result_job_attempt", ["job_id", "attempt"])
    _clean_nonfinite(op.get_bind())
    op.create_table(
        "worker",
        sa.Column("name", sa.String(), primary_key=True),
        sa.Column("hostname", sa.String(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", sa.JSON(), nullable=True),
        sa.Column("gpus", sa.JSON(), nullable=True),
        sa.Column("commit", sa.String(), nullable=True),
        sa.Column("current_job", sa.Integer(), nullable=True),
        sa.Column("current_attempt", sa.Integer(), nullable=True),
        sa.Column("first_seen", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.Column("stopping", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_worker_last_seen", "worker", ["last_seen"])
    op.create_table(
        "dead_letter",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("received_at", sa.Float(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("tries", sa.Integer(), nullable=False),
    )
    op.create_index("ix_dead_letter_received_at", "dead_letter", ["received_at"])


def downgrade() -> None:
    op.drop_table("dead_letter")
    op.drop_table("worker")
    with op.batch_alter_table("result") as batch:
        batch.drop_constraint("uq_result_job_attempt", type_="unique")
        batch.drop_column("nonfinite")
