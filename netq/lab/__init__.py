"""The lab: the tools that netq's notebooks, tests, benchmarks and demo use around the library.

* :mod:`netq.lab.relay`: a loopback link emulator (faults, taps, its own process), each
  direction shaped by a :class:`netq.lab.shaping.Shape` (delay, jitter, rate cap, buffer);
  :mod:`netq.lab.netem` adds real packet loss (the kernel's netem in a network namespace).
* :mod:`netq.lab.trace`: a recorder on a relay that decodes the netq frames crossing it.
* :mod:`netq.lab.brokers`: a private mosquitto (or ``$NETQ_MQTT_BROKER``'s), amqtt;
  :mod:`netq.lab.rabbitmq`: private RabbitMQ nodes and clusters.
* :mod:`netq.lab.demo`: ``python -m netq demo``.
* :mod:`netq.lab.notebook`: what the tutorial notebooks share: measured figures rounded and
  judged (medians, spreads, verdicts with a tolerance), 1-2-5 ticks, an SVG bar chart, and a
  live traffic demo.

None of this is needed to send a message: the core library never imports ``netq.lab``
(tests/test_layers.py checks it); only the command line, :mod:`netq.__main__`, reaches into
it, to run the demo. Importing this package imports none of its modules and starts nothing:
import the one you need, e.g. ``from netq.lab.relay import Relay``.
"""
