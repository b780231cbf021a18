"""A randomized fault soak (issue 23): seeded schedules of network, process and broker faults
against a server and clients in child processes, with netq's guarantees checked throughout.

    python -m tests.soak --seed S --minutes M --transports tcp,tls,mqtt [--replay]

:mod:`.run` builds and drives each transport's run, :mod:`.peer` is the child process (traffic
and a journal), :mod:`.check` judges the journals against docs/guarantees.md.
"""
