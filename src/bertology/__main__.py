"""`python -m bertology ...` is the `bertology` command."""

from bertology.cli.main import main

if __name__ == "__main__":
    main()
