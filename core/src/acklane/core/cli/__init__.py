"""The `acklane` command line: `app` holds the Typer application and `main`; each
command group has a module of its own, imported only when that command runs."""
