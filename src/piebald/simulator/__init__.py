"""Simulator: discrete-event execution of a plan's schedules (``piebald.schedule``) and the
pictures of it (Perfetto trace, Gantt chart). Never imports torch."""
