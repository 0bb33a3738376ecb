"""``python -m acklane.core.cli``: the `acklane` command."""

if __name__ == "__main__":
    from .app import main

    main()
