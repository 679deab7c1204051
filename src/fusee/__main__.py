"""``python -m fusee``: the ``fusee`` command line."""

from fusee.adapters.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
