"""Pure cost functions of the specs: compute time, communication time, memory per rank.

The planner and the simulator price everything through these; measured profiles (a later
layer) override the analytic estimates where they exist.
"""
