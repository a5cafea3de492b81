"""The ``curator`` command."""


def main() -> None:
    raise SystemExit("curator: the command line is not assembled yet")
