"""Delivery in a fleet of ``serve`` instances over Apache Kafka.

Members share nothing but Kafka: each run's records are in one partition of
``<prefix>.episodes`` (keyed by the run key), the member that owns the
partition in the consumer group delivers the run, and what it has delivered
is in ``<prefix>.runs``, committed with its consumer offsets in one Kafka
transaction. ``settings`` names the topics and builds the clients' settings,
``state`` is a run's handover record, ``owner`` tells the uploader which runs
are this member's and records its intents before it acts on them, and
``spool`` puts that gate in front of the two platform calls that must not
happen twice. The consumer loop that feeds the spool is in the collector
(``collector/kafka_member.py``): it reads OTLP.
"""
