"""``python -m analysis`` runs the ``bia`` command line."""

from .cli import main

if __name__ == "__main__":
    main()
