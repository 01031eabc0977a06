"""Simulator: per-rank schedules (shared with the runtime), discrete-event execution of a
plan, and the pictures of it (Perfetto trace, Gantt chart). Never imports torch."""
