"""The contract the simulator and the runtime share: what every rank does in one step.

``ops`` is the instruction set, ``build`` turns a plan into each rank's operation list
(``build_schedule``; 1F1B's order from a dry run over the prices), ``prices`` says how
long each operation takes and what it occupies under the cost model, and ``network``
shares links and NICs among the transfers in flight. The simulator executes the lists
event by event; the runtime's pipeline executor runs them (and, under emulation, paces
them to the prices). Never imports torch.
"""
