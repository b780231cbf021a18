"""The lab: the tools that netq's notebooks, tests, benchmarks and demo use around the library.

A loopback link emulator (:mod:`netq.lab.relay`), a recorder that decodes the frames crossing
it (:mod:`netq.lab.trace`), private MQTT brokers (:mod:`netq.lab.brokers`) and the
``python -m netq demo`` command (:mod:`netq.lab.demo`). None of this is needed to send a
message: the core library never imports ``netq.lab`` (tests/test_layers.py checks it), and
only the command line (:mod:`netq.__main__`) reaches into it, to run the demo.

Importing this package starts nothing and imports none of its modules; import the one you
need, e.g. ``from netq.lab.relay import Relay``.
"""
