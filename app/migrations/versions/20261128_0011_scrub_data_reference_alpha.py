"""compressed releases with the data as reference keep no alpha

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28

Theorem 4.6's ``alpha`` (paper 002) comes from two eigenvalues of the reference
covariance. A ``compressed`` release with no declared reference uses the data's own, so
its ``alpha`` (and ``alpha_pairwise = 2 alpha``) is an exact statistic of the data
(privacy rule 5). Since 0a3d900 it is not reported, and since f6cff34 it is neither
computed nor stored; releases measured before then keep it:

* in their measurement record (``release_measurements.payload``, in clear; never reported
  since 0a3d900), and
* in ``releases.resolved`` for releases measured before 0a3d900, which every read of the
  release still returned.

This sets both to null in those two places, and gives ``resolved`` the note a release
measured today carries. Nothing else changes: the noisy matrix, the privacy cost and the
ledger are untouched. ``release_measurements`` is append-only by trigger (0002); its
UPDATE triggers (found by table, whatever their names) are lifted for this one UPDATE,
in the migration's transaction, and restored before it commits, so no other writer can
change a record meanwhile. The values are gone
for good. A ``release.json`` artifact written before 0a3d900 still holds the alpha it
reported (the upgrade logs those releases' ids, ids only): a re-synthesis
(``POST /v1/releases/{id}/resynthesize``) writes it again without.

The code before f6cff34 reads a stored alpha as a float (``float(data["alpha"])``) and
fails on null, so the downgrade writes infinity there ("the bound does not apply", which
that code took for a singular covariance): no statistic, and a record that code reads.
Today's code ignores the stored alpha of a data reference.
"""

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("curator.migrations")

#: ``app.releases.adapters.compressed.DATA_REFERENCE_NOTE`` as of this revision.
DATA_REFERENCE_NOTE = (
    "not reported: without a declared reference the bound would be computed from the "
    "eigenvalues of the data's own covariance, an exact statistic of the data, and the "
    "truncation region moves with the data, which Theorem 4.6's proof does not cover; "
    "declare params.reference to get alpha"
)

#: How :func:`app.releases.payloads.pack` stores a non-finite float.
_INFINITY = {"__float__": "inf"}

_releases = sa.table(
    "releases",
    sa.column("id", sa.Uuid()),
    sa.column("mechanism", sa.String()),
    sa.column("resolved", sa.JSON()),
)
_measurements = sa.table(
    "release_measurements",
    sa.column("release_id", sa.Uuid()),
    sa.column("payload", sa.JSON()),
)


@contextmanager
def _measurements_writable() -> Iterator[None]:
    """Lift the triggers that make ``release_measurements`` append-only (0002's, by
    whatever name the database has them) for the block, and put them back as they were.
    DDL is transactional on both dialects, so a failure in between rolls them back with
    the rest."""
    bind = op.get_bind()
    dialect = bind.dialect.name
    if dialect == "postgresql":
        names = list(
            bind.execute(
                sa.text(
                    "SELECT tgname FROM pg_trigger WHERE tgrelid = "
                    "'release_measurements'::regclass AND NOT tgisinternal AND tgenabled <> 'D'"
                )
            ).scalars()
        )
        for name in names:
            op.execute(f'ALTER TABLE release_measurements DISABLE TRIGGER "{name}"')
        yield
        for name in names:
            op.execute(f'ALTER TABLE release_measurements ENABLE TRIGGER "{name}"')
    elif dialect == "sqlite":
        triggers = bind.execute(
            sa.text(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' "
                "AND tbl_name = 'release_measurements'"
            )
        ).all()
        updates = [(name, sql) for name, sql in triggers if " UPDATE " in f" {sql.upper()} "]
        for name, _ in updates:
            op.execute(f'DROP TRIGGER "{name}"')
        yield
        for _, sql in updates:
            op.execute(sql)
    else:  # pragma: no cover - the service runs on SQLite and PostgreSQL only
        raise RuntimeError(f"0011 does not know how to lift the triggers on {dialect}")


def _data_reference_records() -> list[tuple[Any, dict[str, Any], dict[str, Any]]]:
    """(release id, measurement payload, resolved) of every measured ``compressed``
    release whose reference was the data."""
    rows = (
        op.get_bind()
        .execute(
            sa.select(_releases.c.id, _measurements.c.payload, _releases.c.resolved)
            .join(_measurements, _measurements.c.release_id == _releases.c.id)
            .where(_releases.c.mechanism == "compressed")
        )
        .all()
    )
    return [
        (release_id, payload, resolved if isinstance(resolved, dict) else {})
        for release_id, payload, resolved in rows
        if isinstance(payload, dict) and payload.get("reference_kind") == "data"
    ]


def _rewrite(alpha: Any, note: bool) -> None:
    bind = op.get_bind()
    records = _data_reference_records()
    changed = [
        (release_id, payload)
        for release_id, payload, _ in records
        if payload.get("alpha") != alpha or payload.get("alpha_pairwise") != alpha
    ]
    if changed:
        with _measurements_writable():
            for release_id, payload in changed:
                bind.execute(
                    _measurements.update()
                    .where(_measurements.c.release_id == release_id)
                    .values(payload={**payload, "alpha": alpha, "alpha_pairwise": alpha})
                )
    if not note:
        return
    reported = []
    for release_id, _, resolved in records:
        if resolved.get("alpha") is not None or resolved.get("alpha_pairwise") is not None:
            reported.append(str(release_id))
            scrubbed = {
                **resolved,
                "alpha": None,
                "alpha_pairwise": None,
                "alpha_note": DATA_REFERENCE_NOTE,
            }
            bind.execute(
                _releases.update().where(_releases.c.id == release_id).values(resolved=scrubbed)
            )
    if reported:
        log.warning(
            "0011: %d compressed releases reported alpha (a statistic of the data) before "
            "it was withheld; their release.json artifacts still hold it until each is "
            "re-synthesised (POST /v1/releases/{id}/resynthesize): %s",
            len(reported),
            ", ".join(reported),
        )


def upgrade() -> None:
    _rewrite(None, note=True)


def downgrade() -> None:
    # resolved keeps its nulls: every version of the code passes resolved through as is.
    _rewrite(_INFINITY, note=False)
