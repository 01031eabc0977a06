"""``python -m piebald`` is the ``piebald`` command (torchrun launches it this way)."""

from piebald.cli import main

if __name__ == "__main__":
    main()
