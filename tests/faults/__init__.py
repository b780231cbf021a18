"""Fault suites, by subject: processes (killed, frozen, restarted, closing, slow), the network
between them (tests/fault_proxy.py: delay, blackhole, reset, truncate, refuse; silent peers),
and hostile input (malformed frames, oversized headers, authkeys, pickle restrictions).

A package, like tests/protocol/: pytest imports these modules as ``faults.<name>`` with tests/
on sys.path, so ``from netq_testing import ...`` and ``conftest.py``'s fixtures resolve as they
do for the modules directly in tests/, and ``.helpers`` is this package's shared module.
"""
