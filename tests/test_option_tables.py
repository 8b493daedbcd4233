"""The command line's option tables (``cli/arguments.py``'s ``option`` rows):
a default read from the environment is the environment's when the parser
is built, as when each option was added by hand, and a repeatable option's
list belongs to one parse alone, though the table holds one default for all."""

from __future__ import annotations

import argparse

import pytest

from prime_runs_otel.cli.serve import add_serve_options
from prime_runs_otel.collector.receiver_config import TOKEN_ENV
from prime_runs_otel.deliver.kafka.settings import BOOTSTRAP_ENV


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="serve")
    add_serve_options(parser)
    return parser


def test_serve_takes_its_token_and_kafka_from_the_environment_of_the_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(BOOTSTRAP_ENV, raising=False)
    before = _serve_parser().parse_args([])
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    monkeypatch.setenv(BOOTSTRAP_ENV, "127.0.0.1:9092")
    after = _serve_parser().parse_args([])

    assert (before.token, before.kafka) == (None, None)
    assert (after.token, after.kafka) == ("s3cret", "127.0.0.1:9092")
    assert _serve_parser().parse_args(["--token", "given"]).token == "given"


def test_a_repeated_option_fills_a_list_of_its_own_parse() -> None:
    parser = _serve_parser()
    first = parser.parse_args(["--kafka-config", "a=1", "--kafka-config", "b=2"])
    second = parser.parse_args([])
    third = _serve_parser().parse_args(["--kafka-config", "c=3"])

    assert first.kafka_config == ["a=1", "b=2"]
    assert second.kafka_config == []
    assert third.kafka_config == ["c=3"]
