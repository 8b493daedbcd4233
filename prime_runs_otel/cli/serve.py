"""``prime-runs-otel serve``: the command line of the OTLP receiver, which
receives OTLP from a collector (or from producers directly) and runs the
exporter core behind it (:mod:`prime_runs_otel.collector`).

Only the wiring is here: the options and their defaults, the receiver with
the run log beside it, and ``python -m prime_runs_otel.cli.serve`` for the
command on its own. The producer end of the same path, ``replay
--otlp-endpoint``, is :mod:`.otlp_replay`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from .._text import configure_logging
from ..collector.bodies import BYTE_COST, VALUE_COST
from ..collector.intake import DEFAULT_MAX_HELD_SPANS, DEFAULT_SETTLE_SECONDS
from ..collector.receiver_config import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_VALUES,
    DEFAULT_MEMORY_BYTES,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_SHUTDOWN_GRACE,
    DEFAULT_STRAGGLER_WAIT,
    DEFAULT_WORKERS,
    TOKEN_ENV,
    MiB,
    ReceiverConfig,
)
from ..collector.run_log import RunWatcher
from ..config import Settings, key_hint, resolve_settings
from ..deliver.kafka.settings import (
    BOOTSTRAP_ENV,
    DEFAULT_PARTITIONS,
    DEFAULT_PREFIX,
    KafkaSettings,
    bootstrap_from_env,
    parse_client_config,
)
from ..errors import ConfigError, PrimeRunsOtelError
from .arguments import (
    add_options,
    non_negative_float,
    option,
    port_number,
    positive_float,
    positive_int,
)
from .doctor import FAIL, OK, platform_check
from .exits import EXIT_OK, exit_code_for
from .extras import SERVE, require

logger = logging.getLogger(__name__)

__all__ = ["add_serve_command", "add_serve_options", "cmd_serve", "main"]


def add_serve_command(subparsers: Any, common: argparse.ArgumentParser | None = None) -> None:
    """Add ``serve`` to the ``prime-runs-otel`` command parser."""
    serve = subparsers.add_parser(
        "serve",
        parents=[common] if common is not None else [],
        help="receive OTLP (from a collector) and report the runs in it",
        description="Receive OTLP/HTTP and OTLP/gRPC spans, typically from an OpenTelemetry "
        "Collector, and deliver the runs in them like the in-process exporter does.",
    )
    add_serve_options(serve)
    serve.set_defaults(func=cmd_serve)


def _token_from_env() -> str | None:
    return os.environ.get(TOKEN_ENV) or None


#: ``serve``'s options, in the order its help lists them.
SERVE_OPTIONS = (
    option("--host", default="127.0.0.1", help="address to listen on"),
    option("--http-port", type=port_number, default=4318, help="OTLP/HTTP port (0: any free one)"),
    option("--grpc-port", type=port_number, default=4317, help="OTLP/gRPC port (0: any free one)"),
    option("--no-grpc", action="store_true", help="serve OTLP/HTTP only"),
    option(
        "--token",
        default_from=_token_from_env,
        help=f"bearer token clients must send (default: ${TOKEN_ENV}); required when "
        "listening beyond loopback",
    ),
    option(
        "--max-body-mib",
        type=positive_float,
        default=DEFAULT_MAX_BODY_BYTES / MiB,
        help="largest request accepted, after decompression (default: %(default)g)",
    ),
    option(
        "--max-values",
        type=positive_int,
        default=DEFAULT_MAX_VALUES,
        help="values (spans, attributes, array elements) one request may hold; more is "
        "refused with 413, counted before decoding (default: %(default)d)",
    ),
    option(
        "--idle-timeout",
        type=non_negative_float,
        default=DEFAULT_IDLE_TIMEOUT,
        help="seconds without spans after which a run with no end span is closed as "
        "crashed (default: %(default)g)",
    ),
    option(
        "--straggler-wait",
        type=non_negative_float,
        default=DEFAULT_STRAGGLER_WAIT,
        help="seconds an ended run waits without news for episodes its end span counts "
        "but that have not arrived, before it closes without them (default: %(default)g)",
    ),
    option(
        "--shutdown-grace",
        type=non_negative_float,
        default=DEFAULT_SHUTDOWN_GRACE,
        help="seconds in-flight requests get to finish on SIGTERM (default: %(default)g)",
    ),
    option(
        "--memory-mib",
        type=float,
        default=DEFAULT_MEMORY_BYTES / MiB,
        help=f"memory the requests being decoded may take together, each counted as {BYTE_COST} "
        f"bytes per decompressed byte plus {VALUE_COST} per value in it; more waits its turn "
        "(default: %(default)g)",
    ),
    option(
        "--read-timeout",
        type=float,
        default=DEFAULT_READ_TIMEOUT,
        help="seconds a request body may take to arrive in full (default: %(default)g)",
    ),
    option(
        "--header-timeout",
        type=positive_float,
        default=DEFAULT_HEADER_TIMEOUT,
        help="seconds the head of a request may take to arrive; a connection that sends "
        "nothing, or stops half-way, is closed then (default: %(default)g)",
    ),
    option(
        "--settle-seconds",
        type=non_negative_float,
        default=DEFAULT_SETTLE_SECONDS,
        help="how long an episode span without a record waits for the rest of its span "
        "tree before its record is synthesised (default: %(default)g)",
    ),
    option(
        "--max-held-spans",
        type=positive_int,
        default=DEFAULT_MAX_HELD_SPANS,
        help="spans held in memory while span trees complete (default: %(default)d)",
    ),
    option(
        "--workers",
        type=positive_int,
        default=DEFAULT_WORKERS,
        help="requests decoded and committed at once (default: %(default)d)",
    ),
    option(
        "--allow-attach",
        action="store_true",
        help="let senders add to a platform run that already exists, named by its id in "
        "prime.run.attach (hosted evals and training runs); without it such runs are refused",
    ),
    option(
        "--max-connections",
        type=positive_int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="HTTP connections open at once, fewer if the descriptor limit is low; past it a "
        "request gets 503 Retry-After (default: %(default)d)",
    ),
    option(
        "--spool-dir", help="spool folder (default: $PRIME_RUNS_OTEL_DIR or ~/.prime/runs-otel)"
    ),
    option(
        "--kafka",
        metavar="BOOTSTRAP",
        default_from=bootstrap_from_env,
        help=f"join the fleet of serve instances on this Kafka cluster (host:port, "
        f"comma-separated; default: ${BOOTSTRAP_ENV}): any member takes any run's spans, the "
        "member that owns the run's partition delivers it (docs/scaling.md)",
    ),
    option(
        "--kafka-topic-prefix",
        default=DEFAULT_PREFIX,
        help="the fleet's topics are <prefix>.episodes and <prefix>.runs (default: %(default)s)",
    ),
    option(
        "--kafka-member",
        help="this member's stable name: a restart under the same name takes its partitions "
        "back at once (Kafka static membership); default: host:http-port",
    ),
    option(
        "--kafka-partitions",
        type=positive_int,
        default=DEFAULT_PARTITIONS,
        help="partitions of <prefix>.episodes when this member creates it: the most members "
        "that share the delivery (default: %(default)d)",
    ),
    option(
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka setting for every Kafka client (security.protocol, sasl.*, ssl.*); "
        "repeat for more",
    ),
    option(
        "--kafka-config-file",
        action="append",
        default=[],
        metavar="FILE",
        help="a properties file of librdkafka settings (KEY=VALUE lines), read before "
        "--kafka-config",
    ),
)


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    add_options(parser, SERVE_OPTIONS)


def kafka_settings(args: argparse.Namespace) -> KafkaSettings | None:
    """The fleet this serve joins, from the ``--kafka*`` options."""
    if not args.kafka:
        return None
    return KafkaSettings(
        bootstrap=args.kafka,
        prefix=args.kafka_topic_prefix,
        member=args.kafka_member,
        partitions=args.kafka_partitions,
        client=parse_client_config(args.kafka_config, args.kafka_config_file),
    )


def cmd_serve(args: argparse.Namespace) -> int:
    require("serve", SERVE, "serve")
    from ..collector.receiver import Receiver  # here: its servers are the [serve] extra's

    config = ReceiverConfig(
        host=args.host,
        http_port=args.http_port,
        grpc_port=None if args.no_grpc else args.grpc_port,
        token=args.token,
        max_body_bytes=int(args.max_body_mib * MiB),
        idle_timeout=args.idle_timeout,
        shutdown_grace=args.shutdown_grace,
        workers=args.workers,
        read_timeout=args.read_timeout,
        memory_bytes=int(args.memory_mib * MiB),
        settle_seconds=args.settle_seconds,
        max_held_spans=args.max_held_spans,
        max_connections=args.max_connections,
        header_timeout=args.header_timeout,
        allow_attach=args.allow_attach,
        max_values=args.max_values,
        straggler_wait=args.straggler_wait,
        kafka=kafka_settings(args),
    )
    config.validate()  # before anything starts: a refused setting is refused at once
    settings = resolve_settings(spool_dir=args.spool_dir)
    if settings.mode == "online":
        check_key_at_start(settings)
    watcher = RunWatcher(settings)
    watcher.start()
    started = False
    try:
        receiver = Receiver(config, settings)
        started = True
        asyncio.run(receiver.serve())
    finally:
        watcher.stop()
        if started:
            logger.info("serve stopped; what it accepted is in %s", settings.spool_path)
    return EXIT_OK


def check_key_at_start(settings: Settings) -> None:
    """Ask the platform about the key before accepting anything, as
    ``doctor`` does: a refused key stops ``serve`` at once (every run it
    accepted would be refused later); a platform that cannot be reached
    now is only a warning, since runs wait in the spool until it can."""
    check = platform_check(settings)
    if check.status == FAIL and "401" in check.detail:
        raise ConfigError(
            f"the platform refused the API key (401) at {settings.base_url}: "
            f"{key_hint()} with a valid key (`prime-runs-otel doctor` tests it), or run "
            "serve with PRIME_RUNS_MODE=local to keep runs on this machine"
        )
    if check.status != OK:
        logger.warning(
            "the platform API at %s: %s; serving anyway, runs wait in %s until it takes them "
            "(`prime-runs-otel doctor` checks the settings)",
            settings.base_url,
            check.detail,
            settings.spool_path,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m prime_runs_otel.cli.serve``: the ``serve`` command on its own."""
    parser = argparse.ArgumentParser(
        prog="prime-runs-otel serve", description="Receive OTLP and report the runs in it."
    )
    add_serve_options(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="log delivery details")
    args = parser.parse_args(argv)
    configure_logging(
        level=logging.DEBUG if args.verbose else logging.INFO,
        fmt="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # One line per platform request drowns the receiver's own messages.
    logging.getLogger("httpx").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return cmd_serve(args)
    except PrimeRunsOtelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_code_for(exc)


if __name__ == "__main__":
    sys.exit(main())
