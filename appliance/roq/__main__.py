"""`python -m roq` and the PyInstaller entry point share the typer application."""

from roq.cli import main

if __name__ == "__main__":
    main()
