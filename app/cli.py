"""The ``curator`` command: serve, worker, migrate, create-user, create-key, demo,
rotate-data-key, reconcile-ledger, backup."""

from __future__ import annotations

import argparse
import codecs
import io
import json
import logging
import os
import re
import socket
import stat
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from alembic.script.revision import RevisionError
from alembic.util import CommandError
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.exc import DBAPIError

from app import __version__
from app.config import KEY_FILE_NAME, ConfigError, Settings, load_settings
from app.core import migrations
from app.core.errors import NotFound
from app.core.logs import LogFormat, log_handler
from app.core.services import Services, set_current
from app.core.threads import limit_blas_threads
from app.models import Role
from app.storage.tables import key_ring

log = logging.getLogger("curator")


class _AlembicPreamble(logging.Filter):
    """Drops the two lines Alembic logs at INFO each time it opens a migration context
    ("Context impl SQLiteImpl.", "Will assume non-transactional DDL."): every command
    checks the schema's revision, and they said nothing to an operator. The lines of an
    actual upgrade ("Running upgrade ...") pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("Context impl", "Will assume"))


def configure_logging(level: str, log_format: LogFormat = "text") -> None:
    """Log to standard error at ``level`` in ``log_format`` (:mod:`app.core.logs`); in
    ``json`` the ``warnings`` module's lines are logged too, as they would otherwise be
    the only lines not in JSON."""
    logging.basicConfig(level=level, handlers=[log_handler(log_format, sys.stderr)])
    if log_format == "json":
        logging.captureWarnings(True)
    migration_log = logging.getLogger("alembic.runtime.migration")
    if not any(isinstance(f, _AlembicPreamble) for f in migration_log.filters):
        migration_log.addFilter(_AlembicPreamble())


def _printable(error: UnicodeError) -> tuple[str | bytes, int]:
    """Codec error handler of ``curator``'s standard output (:func:`_output_never_fails`):
    the bytes Python read from the system and could not decode (a path, an argument) are
    written back as they were (``surrogateescape``), any other character the output's
    encoding lacks is written as a ``\\N`` escape (``backslashreplace``)."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    chunk = error.object[error.start : error.end]
    if all("\udc80" <= c <= "\udcff" for c in chunk):
        return bytes(ord(c) - 0xDC00 for c in chunk), error.end
    return codecs.backslashreplace_errors(error)


codecs.register_error("curator-printable", _printable)


def _output_never_fails() -> None:
    """Standard output in the C locale without UTF-8 mode (``LC_ALL=C PYTHONUTF8=0``) is
    ASCII, strictly but for ``surrogateescape``: a command that printed a non-ASCII name
    (``create-user``) raised after its transaction had committed, and the API key that
    is shown once was lost. Standard error already escapes (``backslashreplace``)."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="curator-printable")


def _argument_text(value: str) -> str | None:
    """A command-line argument as the text the operator typed: in the C locale Python
    decodes the arguments as ASCII (non-ASCII bytes become surrogates), whereas terminals
    send UTF-8. ``None`` for bytes that are not UTF-8 either."""
    if not any("\udc80" <= c <= "\udcff" for c in value):
        return value
    try:
        return os.fsencode(value).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _fail(message: str, code: int = 2) -> int:
    print(f"curator: {message}", file=sys.stderr)
    return code


#: The bits every command (:func:`main`) adds to the process umask: what the service writes
#: in DATA_DIR (the SQLite database, the queue, release artifacts, the port file) is never
#: open to other users. Group bits stay as the operator's umask has them: a deployment whose
#: API and workers run as two users of one group (a setgid DATA_DIR, umask 007) keeps
#: working.
UMASK_OTHERS = 0o007


def _settings() -> Settings:
    settings = load_settings()
    configure_logging(settings.log_level, settings.log_format)
    # a key the service has is checked, none is generated here: a command that needs one
    # gets it from Services.build, which refuses to generate one for a database holding
    # stored datasets (curator migrate needs none)
    settings.prepare_directories()
    settings.existing_key()
    _warn_if_shared(settings.data_dir)
    return settings


def _limit_blas(settings: Settings) -> None:
    """``CURATOR_BLAS_THREADS`` for this process (:func:`app.core.threads.limit_blas_threads`)."""
    if settings.blas_threads:
        counts = limit_blas_threads(settings.blas_threads)
        log.info(
            "BLAS: at most %d thread(s) per matrix product in each of %d libraries "
            "(CURATOR_BLAS_THREADS)",
            max(counts, default=0),
            len(counts),
        )


def _warn_if_shared(data_dir: Path) -> None:
    """Warn when DATA_DIR is open to users outside its group. The files the service writes
    are not (:data:`UMASK_OTHERS`), but files written before, or by other tools, keep their
    mode, and the database, the queue and the release artifacts are not encrypted: a
    directory closed to others keeps them all from other users."""
    mode = stat.S_IMODE(data_dir.stat().st_mode)
    if mode & 0o007:
        log.warning(
            "CURATOR_DATA_DIR (%s) is accessible to users outside its group (mode %s); its "
            "database, queue and release artifacts are not encrypted: run: chmod o-rwx %s",
            data_dir,
            oct(mode),
            data_dir,
        )


def _without_password(url: str) -> str:
    """``url`` with its password (if any) shown as ``***``, for messages. The user info
    ends at the last ``@`` (an unescaped password may contain ``@``, ``/`` or ``:``); a
    ``password=`` in the query string (redis-py and libpq take one there) is hidden too."""
    url = re.sub(r"([?&]password=)[^&#]*", r"\1***", url)
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not (sep and at) or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"


def _unusable(what: str, url: str, exc: BaseException) -> int:
    """Refuse to start: the store at ``url`` cannot be reached or opened. Exit code 1
    (the environment, not the command line, is at fault)."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return _fail(f"the {what} cannot be used ({_without_password(url)}): {lines[0]}", code=1)


def cmd_migrate(args: argparse.Namespace) -> int:
    settings = _settings()
    url = settings.resolved_database_url
    try:
        target = migrations.resolve_revision(url, args.revision)
    except (CommandError, RevisionError) as exc:
        return _fail(f"--revision {args.revision!r}: {exc}")
    except DBAPIError as exc:  # a relative revision reads the database's own
        return _unusable("database", url, exc.orig or exc)
    try:
        # the resolved id, not a relative name: what was checked is what is applied
        migrations.upgrade(url, target or args.revision)
        revision = migrations.current_revision(url)
    except DBAPIError as exc:
        return _unusable("database", url, exc.orig or exc)
    if revision != target:
        return _fail(
            f"the database is at revision {revision}, past {target or 'base'}; curator "
            "migrate only upgrades (a downgrade loses data: run alembic downgrade deliberately)"
        )
    print(f"database at revision {revision}")
    return 0


def _check_schema(settings: Settings, migrate: bool) -> int | None:
    url = settings.resolved_database_url
    try:
        if migrate:
            migrations.upgrade(url)
            return None
        current, head = migrations.current_revision(url), migrations.head_revision(url)
    except DBAPIError as exc:
        return _unusable("database", url, exc.orig or exc)
    if current != head:
        return _fail(
            f"the database is at revision {current}, the code needs {head}; run: curator migrate"
        )
    return None


def _check_spends(services: Services) -> int | None:
    """Refuse to start when the database's ledger lacks spends that the spend journal in
    DATA_DIR records (a database restored from a backup older than releases already
    published: their budget would be spent again; :mod:`app.ledger.journal`). Exit 1,
    naming the datasets, the amounts and what to do. Writes the journal from the ledger
    when there is none. Logs an error when datasets' file keys do not open with the
    data key (started without it: a restore that left the key behind)."""
    from app.datasets.service import sealed_with_another_key
    from app.ledger import journal

    spend_journal = journal.SpendJournal(services.settings.spend_journal_path)
    try:
        journal.check(services.db, spend_journal)
    except (journal.LostSpends, journal.JournalCorrupt) as exc:
        return _fail(str(exc), code=1)
    with services.db.transaction(read_only=True) as session:
        unopened = sealed_with_another_key(session, services.data_key)
    if unopened:
        # not a refusal: downloads and answers, which need no key, go on
        log.error(
            "%d dataset(s) hold file keys that CURATOR_DATA_KEY (or %s) does not open: "
            "their releases will fail. Was the data directory restored, or the service "
            "started, with another CURATOR_DATA_KEY? "
            "Stop, put the key back (CURATOR_DATA_KEY, or the old data.key) and restart",
            unopened,
            services.settings.data_dir / KEY_FILE_NAME,
        )
    return None


def _check_queue(services: Services) -> int | None:
    """Refuse to start a consumer whose queue (Redis) cannot be reached: it could take no
    job, and a wrong URL would show only as the consumer's one warning that Redis is down."""
    try:
        services.queue.ping()
    except Exception as exc:
        return _unusable(
            "queue", services.settings.redis_url or str(services.settings.queue_path), exc
        )
    return None


def _listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound and listening before the app starts: a taken address is
    refused before the app and its embedded worker start (uvicorn started them, then
    failed to bind), and the socket is handed to uvicorn rather than let go and bound
    again, so no other process can take the port in between; with port 0 the system picks
    a free one. ``SO_REUSEADDR``, as uvicorn sets it."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _write_port(path: Path, port: int) -> None:
    """Write ``port`` to ``path`` whole (a reader sees no file or the complete number)."""
    partial = path.with_name(f"{path.name}.partial")
    partial.write_text(f"{port}\n")
    partial.replace(path)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app

    settings = _settings()
    refused = _check_schema(settings, migrate=not args.no_migrate)
    if refused is not None:
        return refused
    _limit_blas(settings)
    app = create_app(settings, embedded_worker=not args.no_worker)
    refused = _check_spends(app.state.services) or _check_queue(app.state.services)
    if refused is not None:
        app.state.services.close()
        return refused
    try:
        sock = _listen(args.host, args.port)
    except OSError as exc:
        app.state.services.close()
        return _fail(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", code=1)
    port = int(sock.getsockname()[1])
    if args.port_file is not None:
        try:
            _write_port(args.port_file, port)
        except OSError as exc:
            sock.close()
            app.state.services.close()
            return _fail(
                f"cannot write --port-file {args.port_file}: {exc.strerror or exc}", code=1
            )
    log.info(
        "privacy curator %s on %s (data in %s, %s, worker %s)",
        __version__,
        _url(args.host, port),
        settings.data_dir.resolve(),
        "PostgreSQL" if settings.resolved_database_url.startswith("postgresql") else "SQLite",
        "off" if args.no_worker else "embedded",
    )
    server = uvicorn.Server(
        # log_config=None: uvicorn's own lines (uvicorn.error, uvicorn.access) go to the
        # handler configure_logging set, in CURATOR_LOG_FORMAT, not to uvicorn's handlers
        uvicorn.Config(
            app,
            host=args.host,
            port=port,
            log_level=settings.log_level.lower(),
            log_config=None,
        )
    )
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # the SIGINT uvicorn shut down on, re-raised: as uvicorn.run does
        pass
    finally:
        sock.close()
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _settings()
    refused = _check_schema(settings, migrate=False)
    if refused is not None:
        return refused
    from app.releases.stages import Sweeper, worker_connections

    _limit_blas(settings)
    threads = args.threads or settings.worker_threads
    services = Services.build(settings, connections=worker_connections(threads))
    refused = _check_spends(services) or _check_queue(services)
    if refused is not None:
        services.close()
        return refused
    set_current(services)
    consumer = services.queue.consumer(threads, embedded=False)
    sweeper = Sweeper(services).start()
    log.info(
        "worker started (%s queue, tasks: %s)", services.queue.backend, services.queue.task_names
    )
    try:
        consumer.run()
    finally:
        sweeper.stop()
        services.close()
    return 0


def cmd_create_user(args: argparse.Namespace) -> int:
    from app.core.types import Name
    from app.users import service

    text = _argument_text(args.name)
    if text is None:
        return _fail("--name is not UTF-8 text")
    try:
        name = TypeAdapter(Name).validate_python(text)
    except ValidationError:
        return _fail("--name must be 1 to 200 characters, without control characters")
    settings = _settings()
    refused = _check_schema(settings, migrate=False)
    if refused is not None:
        return refused
    services = Services.build(settings)
    try:
        with services.db.transaction() as session:
            user, key, secret = service.create_user(session, name, Role(args.role), None)
            out = {
                "id": str(user.id),
                "name": user.name,
                "role": user.role,
                "key_id": str(key.id),
                "api_key": secret,
            }
    finally:
        services.close()
    if args.json:
        print(json.dumps(out))
    else:
        print(f"created {out['role']} {out['name']} ({out['id']})")
        print(f"API key (shown once): {out['api_key']}")
    return 0


def cmd_create_key(args: argparse.Namespace) -> int:
    from app.users import service

    settings = _settings()
    refused = _check_schema(settings, migrate=False)
    if refused is not None:
        return refused
    services = Services.build(settings)
    try:
        with services.db.transaction() as session:
            key, secret = service.create_key(session, args.user_id, None)
    except NotFound:
        return _fail(f"no user with id {args.user_id}", code=1)
    finally:
        services.close()
    out = {"key_id": str(key.id), "api_key": secret}
    print(json.dumps(out) if args.json else f"API key (shown once): {secret}")
    return 0


def cmd_rotate_data_key(args: argparse.Namespace) -> int:
    """Re-encrypt the stored datasets under fresh keys of their own, sealed with
    ``CURATOR_DATA_KEY``; the previous keys come from ``CURATOR_PREVIOUS_DATA_KEYS``.
    Exit 1 if a file could not be re-encrypted."""
    from app.datasets.service import rotate_data_key

    settings = _settings()
    if not settings.previous_keys():
        return _fail(
            "CURATOR_PREVIOUS_DATA_KEYS is not set: set CURATOR_DATA_KEY to the new key and "
            "CURATOR_PREVIOUS_DATA_KEYS to the key(s) the files were written with"
        )
    refused = _check_schema(settings, migrate=False)
    if refused is not None:
        return refused
    services = Services.build(settings)
    try:
        done = rotate_data_key(services)
    finally:
        services.close()
    out = {
        "rotated": len(done.rotated),
        "current": len(done.current),
        "missing": done.missing,
        "unreadable": done.unreadable,
        "failed": done.failed,
        "superseded": len(done.superseded),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"re-encrypted {out['rotated']} dataset file(s) under new keys of their own, "
            f"sealed with CURATOR_DATA_KEY; {out['current']} already were"
        )
        for name in done.missing:
            print(f"missing: {name} (its dataset row names it, the file is not there)")
        for name in done.unreadable:
            print(f"unreadable: {name} (no key of the ring opens it; left as it was)")
        for name in done.failed:
            print(f"failed: {name} (not a readable table: corrupt? left as it was)")
        if done.superseded:
            print(
                f"{len(done.superseded)} dataset(s) changed while this ran (re-encrypted by "
                "another run, or their data deleted): left to that change"
            )
    if done.missing or done.unreadable or done.failed:
        return 1
    print(
        "every dataset file's key is now sealed with CURATOR_DATA_KEY alone: restart the API "
        "and the workers without CURATOR_PREVIOUS_DATA_KEYS to retire the old key(s)",
        file=sys.stderr,
    )
    return 0


def cmd_reconcile_ledger(args: argparse.Namespace) -> int:
    """Compare the ledger with the spend journal; with ``--recharge``, charge the spends
    the database lost to the ledger again. Exit 1 while spends are lost."""
    from app.ledger import journal

    settings = _settings()
    refused = _check_schema(settings, migrate=False)
    if refused is not None:
        return refused
    services = Services.build(settings)
    spend_journal = journal.SpendJournal(settings.spend_journal_path)
    try:
        with services.db.transaction() as session:
            journal.ensure_journal(session, spend_journal)
            lost = journal.lost_spends(session, spend_journal)
            if not lost:
                print("the ledger holds every spend the journal records: nothing lost")
                return 0
            if not args.recharge:
                print(journal.LostSpends(spend_journal, lost), file=sys.stderr)
                for spend in lost:
                    print(
                        f"lost: release {spend.release_id} ({spend.mechanism}) of dataset "
                        f"{spend.dataset_id}: {spend.kind}"
                    )
                return 1
            done = journal.recharge(session, spend_journal, lost)
    except (ValueError, journal.JournalCorrupt) as exc:  # rolled back: nothing charged
        return _fail(str(exc), code=1)
    finally:
        services.close()
    print(
        f"charged {len(done.settled) + len(done.recreated)} lost spend(s) to the ledger again "
        f"({len(done.settled)} of releases the database still had, now failed; "
        f"{len(done.recreated)} of releases it had lost, recorded again as failed)"
    )
    for release_id in done.unknown_dataset:
        print(
            f"release {release_id}: its dataset is not in this database (uploaded after the "
            "backup); nothing to charge, its loss accepted in the journal"
        )
    return 0


def cmd_backup(args: argparse.Namespace) -> int:
    """Back up an embedded deployment (SQLite database and DATA_DIR's files) into a new
    directory while it runs (:mod:`app.core.backup`). Exit 1 if the copy is not
    consistent (it is left without its manifest), 2 if it cannot be made here."""
    from app.core.backup import BackupError, backup, sqlite_path

    settings = load_settings()  # not _settings(): nothing is created before the checks
    configure_logging(settings.log_level, settings.log_format)
    try:
        sqlite_path(settings)  # PostgreSQL is refused before anything is read or written
    except BackupError as exc:
        return _fail(str(exc))
    current = settings.existing_key()
    if current is None:
        # never generated here (load_key would, for a database without stored data): every
        # file would fail the check as if a rotation had run, and DATA_DIR would keep a key
        # that opens none of them
        return _fail(
            "no data key: CURATOR_DATA_KEY is not set and there is no "
            f"{settings.data_dir / KEY_FILE_NAME}; run curator backup with the service's "
            "environment (its CURATOR_DATA_KEY)"
        )
    settings.prepare_directories()
    _warn_if_shared(settings.data_dir)
    refused = _check_schema(settings, migrate=False)
    if refused is not None:
        return refused
    ring = key_ring(current, settings.previous_keys())
    try:
        report = backup(settings, ring, args.directory, with_key=args.with_key)
    except BackupError as exc:
        return _fail(str(exc))
    for problem in report.problems:
        print(f"inconsistent: {problem}", file=sys.stderr)
    if report.problems:
        return _fail(
            f"the copy in {args.directory} is not consistent (no manifest.json): remove it and "
            "run curator backup again",
            code=1,
        )
    print(
        f"backed up the database, {report.datasets} dataset file(s) and {report.releases} "
        f"published release(s) into {args.directory}"
    )
    if report.key_included:
        print(
            f"the data key is in the backup ({args.directory / KEY_FILE_NAME}): whoever holds "
            "the backup opens every dataset file in it; keep it as you keep the key",
            file=sys.stderr,
        )
    else:
        print(
            "the data key is not in the backup (without it no dataset file opens): keep "
            "CURATOR_DATA_KEY, or DATA_DIR/data.key, apart from it; --with-key includes it",
            file=sys.stderr,
        )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from app.demo.runner import DemoError, run

    configure_logging("WARNING")
    try:
        run(args.data_dir)
    except DemoError as exc:
        return _fail(f"demo failed: {exc}", code=1)
    return 0


def _bounded(lower: int, upper: int) -> Callable[[str], int]:
    """An argparse type: an integer in ``[lower, upper]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lower <= value <= upper:
            raise argparse.ArgumentTypeError(f"{value} is not in {lower}-{upper}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="curator", description="privacy curator service")
    parser.add_argument("--version", action="version", version=f"curator {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the API with an embedded worker")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)"
    )
    serve.add_argument(
        "--port",
        type=_bounded(0, 65535),
        default=8000,
        help="port to listen on, 0-65535; 0 takes a free one the system picks (default: 8000)",
    )
    serve.add_argument(
        "--port-file",
        type=Path,
        default=None,
        help="once the server listens, write its port to this file (give a path that does not "
        "exist yet, and wait for it)",
    )
    serve.add_argument(
        "--no-migrate",
        action="store_true",
        help="do not upgrade the database first; refuse to start if it is not current",
    )
    serve.add_argument("--no-worker", action="store_true", help="run the API only")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="run a worker (no API)")
    worker.add_argument(
        "--threads",
        type=_bounded(1, 64),
        default=None,
        help="worker threads, 1-64 (default: CURATOR_WORKER_THREADS)",
    )
    worker.set_defaults(func=cmd_worker)

    migrate = sub.add_parser("migrate", help="upgrade the database schema")
    migrate.add_argument(
        "--revision",
        default="head",
        help="upgrade to this revision: an id, head, or +N / ID+N revisions past the "
        "database's or ID (default: head)",
    )
    migrate.set_defaults(func=cmd_migrate)

    create_user = sub.add_parser("create-user", help="create a user and print its API key")
    create_user.add_argument("--name", required=True, help="1-200 characters")
    create_user.add_argument("--role", required=True, choices=[r.value for r in Role])
    create_user.add_argument("--json", action="store_true", help="print one JSON object")
    create_user.set_defaults(func=cmd_create_user)

    demo = sub.add_parser(
        "demo", help="run the whole flow on WDBC in one process and print a short report"
    )
    demo.add_argument(
        "--data-dir", type=Path, default=None, help="keep the demo's data here (default: temporary)"
    )
    demo.set_defaults(func=cmd_demo)

    create_key = sub.add_parser("create-key", help="issue another API key for a user")
    create_key.add_argument("--user-id", required=True, type=uuid.UUID, help="the user's id")
    create_key.add_argument("--json", action="store_true", help="print one JSON object")
    create_key.set_defaults(func=cmd_create_key)

    rotate = sub.add_parser(
        "rotate-data-key",
        help="re-encrypt the stored datasets under fresh keys sealed with CURATOR_DATA_KEY "
        "(the old keys in CURATOR_PREVIOUS_DATA_KEYS)",
    )
    rotate.add_argument("--json", action="store_true", help="print one JSON object")
    rotate.set_defaults(func=cmd_rotate_data_key)

    reconcile = sub.add_parser(
        "reconcile-ledger",
        help="compare the ledger with the spend journal in DATA_DIR (after restoring a "
        "database backup); exit 1 if the database lost spends",
    )
    reconcile.add_argument(
        "--recharge",
        action="store_true",
        help="charge the lost spends to the ledger again (recorded in the audit log)",
    )
    reconcile.set_defaults(func=cmd_reconcile_ledger)

    backup = sub.add_parser(
        "backup",
        help="copy the SQLite database (online backup) and the files it names into a new "
        "directory, while the service runs",
    )
    backup.add_argument("directory", type=Path, help="a directory that does not exist or is empty")
    backup.add_argument(
        "--with-key",
        action="store_true",
        help="include the data key (then the backup alone opens the dataset files)",
    )
    backup.set_defaults(func=cmd_backup)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    # before any command creates a file: the operator's umask, closed to others
    os.umask(os.umask(0) | UMASK_OTHERS)
    _output_never_fails()
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except ConfigError as exc:
        code = _fail(f"configuration error: {exc}")
    except DBAPIError as exc:  # the database went away after the start-up checks
        lines = str(exc.orig or exc).strip().splitlines() or [type(exc).__name__]
        code = _fail(f"database error: {lines[0]}", code=1)
    raise SystemExit(code)
