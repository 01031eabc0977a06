"""The ``piebald`` command line: each module parses one command's flags, calls the library
(``piebald.api`` and the packages below it) and renders the result with rich and
matplotlib. Nothing below this package prints or reads flags."""

from piebald.cli.commands import app, main

__all__ = ["app", "main"]
