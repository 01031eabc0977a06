"""What a plan says to a reader: its one-line description and its explanation.

Pure text from specs and estimates (no printing, no torch); the CLI renders it.
"""
