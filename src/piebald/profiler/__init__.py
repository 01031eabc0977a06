"""Profiler: measured compute, memory and link numbers, kept in a ProfileDB that the cost
model prefers over its formulas."""
