"""Tests for async_tee.config: every variable parsed defensively from a given environ."""

from __future__ import annotations

import dataclasses
import logging
import socket

import pytest

from async_tee import config
from async_tee.config import Settings, load_settings


def warnings(caplog):
    return [r for r in caplog.records if r.name == "async_tee" and r.levelno == logging.WARNING]


def messages(caplog):
    return [r.getMessage() for r in warnings(caplog)]


def all_logged_text(caplog):
    """Everything a handler could print: messages, raw args and any traceback."""
    parts = []
    for r in caplog.records:
        parts.append(r.getMessage())
        parts.append(repr(r.args))
        if r.exc_text:
            parts.append(r.exc_text)
    return "\n".join(parts)


IDENTITY = ("rl.run.id", "nemo.run.id", "host.name", "service.instance.id")


def resource(settings):
    """The resource attributes but the identity every session gets (see test_identity.py)."""
    return {
        k: v
        for k, v in settings.resource_attributes
        if k not in IDENTITY and (k, v) != ("service.name", config.default_service_name())
    }


def without_identity(settings):
    return dataclasses.replace(settings, resource_attributes=tuple(resource(settings).items()))


def identity(settings):
    return {k: v for k, v in settings.resource_attributes if k in IDENTITY}


# ------------------------------------------------------------------------------ defaults


def test_defaults(logs):
    settings = load_settings(environ={})
    assert without_identity(settings) == Settings()
    assert sorted(identity(settings)) == sorted(IDENTITY)
    assert settings.step_export is True
    assert settings.min_export_interval_s == 1.0
    assert settings.enabled is True
    assert settings.queue_size == 1024
    assert settings.drain_interval_s == 0.05
    assert settings.shutdown_timeout_s == 5.0
    assert settings.max_attribute_sets == 512
    assert settings.exporters == ("otlp",)
    assert settings.otlp_protocol == "http/protobuf"
    assert settings.otlp_endpoint == "http://localhost:4318/v1/metrics"
    assert settings.otlp_headers == ()
    assert settings.otlp_timeout_s == 10.0
    assert settings.otlp_insecure is None
    assert settings.export_interval_ms == 60_000.0
    assert settings.export_timeout_ms == 30_000.0
    assert settings.prometheus_host == "127.0.0.1"
    assert settings.prometheus_port == 9464
    assert resource(settings) == {}
    assert warnings(logs) == []


def test_blank_values_mean_default_without_a_warning(logs):
    blank = {
        "ASYNC_TEE_ENABLED": "",
        "ASYNC_TEE_QUEUE_SIZE": "  ",
        "OTEL_METRICS_EXPORTER": "",
        "OTEL_EXPORTER_OTLP_ENDPOINT": " ",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "",
        "OTEL_EXPORTER_OTLP_HEADERS": "",
        "OTEL_EXPORTER_OTLP_INSECURE": "",
    }
    assert without_identity(load_settings(environ=blank)) == Settings()
    assert warnings(logs) == []


def test_os_environ_is_not_read_when_a_dict_is_given(monkeypatch):
    monkeypatch.setenv("ASYNC_TEE_QUEUE_SIZE", "7")
    assert load_settings(environ={}).queue_size == 1024


# ---------------------------------------------------------------------------- queue size


@pytest.mark.parametrize(("raw", "expected"), [("1", 1), ("64", 64), (" 2048 ", 2048)])
def test_queue_size_valid(logs, raw, expected):
    assert load_settings(environ={"ASYNC_TEE_QUEUE_SIZE": raw}).queue_size == expected
    assert warnings(logs) == []


@pytest.mark.parametrize("raw", ["abc", "0", "-5", "1.5", "nan", "inf", "1e9"])
def test_queue_size_malformed_uses_default_with_one_warning(logs, raw):
    assert load_settings(environ={"ASYNC_TEE_QUEUE_SIZE": raw}).queue_size == 1024
    (message,) = messages(logs)
    assert "ASYNC_TEE_QUEUE_SIZE" in message
    assert repr(raw) in message


def test_one_warning_per_malformed_variable(logs):
    settings = load_settings(
        environ={
            "ASYNC_TEE_QUEUE_SIZE": "abc",
            "ASYNC_TEE_DRAIN_INTERVAL": "soon",
            "ASYNC_TEE_SHUTDOWN_TIMEOUT": "-1",
            "ASYNC_TEE_MAX_ATTRIBUTE_SETS": "0",
            "OTEL_EXPORTER_PROMETHEUS_PORT": "70000",
        }
    )
    assert without_identity(settings) == Settings()
    found = messages(logs)
    assert len(found) == 5
    for name in (
        "ASYNC_TEE_QUEUE_SIZE",
        "ASYNC_TEE_DRAIN_INTERVAL",
        "ASYNC_TEE_SHUTDOWN_TIMEOUT",
        "ASYNC_TEE_MAX_ATTRIBUTE_SETS",
        "OTEL_EXPORTER_PROMETHEUS_PORT",
    ):
        assert sum(name in m for m in found) == 1, name


@pytest.mark.parametrize(("raw", "expected"), [("0", 0.0), ("0.25", 0.25), ("300", 300.0)])
def test_held_ttl(logs, raw, expected):
    assert load_settings(environ={"ASYNC_TEE_HELD_TTL": raw}).held_ttl_s == expected
    assert warnings(logs) == []


@pytest.mark.parametrize("raw", ["-1", "soon", "nan", "1e9"])
def test_held_ttl_malformed_uses_default_with_one_warning(logs, raw):
    assert load_settings(environ={"ASYNC_TEE_HELD_TTL": raw}).held_ttl_s == 90.0
    (message,) = messages(logs)
    assert "ASYNC_TEE_HELD_TTL" in message


def test_float_durations():
    settings = load_settings(
        environ={
            "ASYNC_TEE_DRAIN_INTERVAL": "0.2",
            "ASYNC_TEE_SHUTDOWN_TIMEOUT": "0",
            "ASYNC_TEE_MAX_ATTRIBUTE_SETS": "3",
            "OTEL_METRIC_EXPORT_INTERVAL": "1000",
            "OTEL_METRIC_EXPORT_TIMEOUT": "500",
            "OTEL_EXPORTER_PROMETHEUS_HOST": "0.0.0.0",
            "OTEL_EXPORTER_PROMETHEUS_PORT": "9100",
        }
    )
    assert settings.drain_interval_s == 0.2
    assert settings.shutdown_timeout_s == 0.0
    assert settings.max_attribute_sets == 3
    assert settings.export_interval_ms == 1000.0
    assert settings.export_timeout_ms == 500.0
    assert settings.prometheus_host == "0.0.0.0"
    assert settings.prometheus_port == 9100


# ------------------------------------------------------------------------------- enabled


@pytest.mark.parametrize("raw", ["0", "false", "FALSE", "False", "no", "off", " Off "])
def test_async_tee_enabled_false_variants(logs, raw):
    assert load_settings(environ={"ASYNC_TEE_ENABLED": raw}).enabled is False
    assert warnings(logs) == []


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "yes", "on"])
def test_async_tee_enabled_true_variants(logs, raw):
    assert load_settings(environ={"ASYNC_TEE_ENABLED": raw}).enabled is True
    assert warnings(logs) == []


def test_async_tee_enabled_malformed_keeps_default_with_a_warning(logs):
    assert load_settings(environ={"ASYNC_TEE_ENABLED": "maybe"}).enabled is True
    (message,) = messages(logs)
    assert "ASYNC_TEE_ENABLED" in message


@pytest.mark.parametrize(
    ("environ", "enabled"),
    [
        ({"OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_SDK_DISABLED": "false"}, True),
        ({"OTEL_SDK_DISABLED": "true", "ASYNC_TEE_ENABLED": "true"}, False),
        ({"OTEL_SDK_DISABLED": "false", "ASYNC_TEE_ENABLED": "0"}, False),
    ],
)
def test_otel_sdk_disabled(environ, enabled):
    assert load_settings(environ=environ).enabled is enabled


# ----------------------------------------------------------------------------- exporters


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("otlp", ("otlp",)),
        ("console", ("console",)),
        ("prometheus", ("prometheus",)),
        ("console,otlp", ("console", "otlp")),
        (" OTLP , Console ", ("otlp", "console")),
        ("otlp,otlp", ("otlp",)),
        ("none", ("none",)),
        ("otlp,none", ("otlp",)),
        ("otlp,,console", ("otlp", "console")),
    ],
)
def test_metrics_exporter(logs, raw, expected):
    assert load_settings(environ={"OTEL_METRICS_EXPORTER": raw}).exporters == expected
    assert warnings(logs) == []


@pytest.mark.parametrize("raw", ["zipkin", "otlp,bogus", ",", "otlp;console"])
def test_metrics_exporter_unknown_uses_default_with_a_warning(logs, raw):
    assert load_settings(environ={"OTEL_METRICS_EXPORTER": raw}).exporters == ("otlp",)
    (message,) = messages(logs)
    assert "OTEL_METRICS_EXPORTER" in message


# ------------------------------------------------------------------ protocol and endpoint


@pytest.mark.parametrize(
    ("environ", "protocol", "endpoint"),
    [
        pytest.param({}, "http/protobuf", "http://localhost:4318/v1/metrics", id="default"),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc", "http://localhost:4317", id="grpc"
        ),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"},
            "grpc",
            "http://c:4317",
            id="grpc-general-endpoint-as-is",
        ),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            "http/protobuf",
            "http://localhost:4318/v1/metrics",
            id="http-default",
        ),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "HTTP/Protobuf"},
            "http/protobuf",
            "http://localhost:4318/v1/metrics",
            id="http-case-insensitive",
        ),
        pytest.param(
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
            },
            "http/protobuf",
            "http://collector:4318/v1/metrics",
            id="http-appends-path",
        ),
        pytest.param(
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
            },
            "http/protobuf",
            "http://collector:4318/v1/metrics",
            id="http-appends-path-after-trailing-slash",
        ),
        pytest.param(
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "https://gw.example/otel",
            },
            "http/protobuf",
            "https://gw.example/otel/v1/metrics",
            id="http-appends-path-to-a-base-path",
        ),
        pytest.param(
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:9999/custom",
            },
            "http/protobuf",
            "http://m:9999/custom",
            id="http-metrics-endpoint-as-is",
        ),
        pytest.param(
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:9999/custom/",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://general:4318",
            },
            "http/protobuf",
            "http://m:9999/custom/",
            id="http-metrics-endpoint-beats-general",
        ),
        pytest.param(
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:4317",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://general:4317",
            },
            "grpc",
            "http://m:4317",
            id="grpc-metrics-endpoint-beats-general",
        ),
        pytest.param(
            {
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            },
            "http/protobuf",
            "http://localhost:4318/v1/metrics",
            id="metrics-protocol-beats-general",
        ),
        pytest.param(
            {
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            "grpc",
            "http://localhost:4317",
            id="metrics-protocol-grpc-beats-general-http",
        ),
    ],
)
def test_protocol_and_endpoint(logs, environ, protocol, endpoint):
    settings = load_settings(environ=environ)
    assert settings.otlp_protocol == protocol
    assert settings.otlp_endpoint == endpoint
    assert warnings(logs) == []


@pytest.mark.parametrize("raw", ["http/json", "thrift", "udp"])
def test_unsupported_protocol_falls_back_to_the_default_with_a_warning(logs, raw):
    settings = load_settings(environ={"OTEL_EXPORTER_OTLP_PROTOCOL": raw})
    assert settings.otlp_protocol == "http/protobuf"
    assert settings.otlp_endpoint == "http://localhost:4318/v1/metrics"
    (message,) = messages(logs)
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" in message


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"]
)
def test_the_grpc_port_with_the_default_protocol_is_warned_about(logs, variable):
    """The Python SDK's ``otlp`` exporter defaults to gRPC, so its users point at 4317; sent
    OTLP/HTTP (the default here, as in the OTel specification), every export would fail."""
    settings = load_settings(environ={variable: "http://collector:4317"})
    assert settings.otlp_protocol == "http/protobuf"
    (message,) = messages(logs)
    assert "4317" in message
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=grpc" in message
    chosen = {variable: "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    logs.clear()
    load_settings(environ=chosen)  # chosen, not defaulted: said nothing
    assert messages(logs) == []


# ------------------------------------------------------------------------------- headers


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("api-key=abc", (("api-key", "abc"),)),
        ("API-Key=abc", (("api-key", "abc"),)),
        (" a = 1 , b=2 ", (("a", "1"), ("b", "2"))),
        ("a=1,,b=2,", (("a", "1"), ("b", "2"))),
        ("authorization=Bearer%20tok%3Den", (("authorization", "Bearer tok=en"),)),
        ("authorization=Basic dXNlcjpwYXNz==", (("authorization", "Basic dXNlcjpwYXNz=="),)),
        ("x%2Dkey=v", (("x-key", "v"),)),
        ("empty=", (("empty", ""),)),
    ],
)
def test_headers(logs, raw, expected):
    assert load_settings(environ={"OTEL_EXPORTER_OTLP_HEADERS": raw}).otlp_headers == expected
    assert warnings(logs) == []


def test_metrics_headers_beat_the_general_ones():
    settings = load_settings(
        environ={
            "OTEL_EXPORTER_OTLP_HEADERS": "general=1",
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "specific=2",
        }
    )
    assert settings.otlp_headers == (("specific", "2"),)


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20SECRET-TOKEN,garbage-SECRET"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "SECRET-TOKEN"),
        ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "=SECRET-TOKEN"),
        ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-api-key=SECRET-TOKEN, =SECRET"),
    ],
)
def test_malformed_headers_give_none_and_a_warning_without_the_secret(logs, name, raw):
    settings = load_settings(environ={name: raw})
    assert settings.otlp_headers == ()
    (message,) = messages(logs)
    assert name in message
    text = all_logged_text(logs)
    assert "SECRET" not in text
    assert "garbage" not in text
    assert "SECRET" not in settings.describe()


def test_describe_does_not_contain_header_values():
    settings = load_settings(
        environ={"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20hunter2,x-tenant=acme42"}
    )
    assert settings.otlp_headers == (("authorization", "Bearer hunter2"), ("x-tenant", "acme42"))
    text = settings.describe()
    assert "hunter2" not in text
    assert "acme42" not in text
    assert "authorization" in text
    assert "x-tenant" in text
    assert "otlp_endpoint='http://localhost:4318/v1/metrics'" in text
    assert "\n" not in text


# ------------------------------------------------------------------------------- timeout


@pytest.mark.parametrize(("raw", "expected"), [("5", 5.0), ("2.5", 2.5), ("999", 999.0)])
def test_timeout_seconds(logs, raw, expected):
    assert load_settings(environ={"OTEL_EXPORTER_OTLP_TIMEOUT": raw}).otlp_timeout_s == expected
    assert warnings(logs) == []


@pytest.mark.parametrize(("raw", "expected"), [("10000", 10.0), ("1000", 1.0), ("2500", 2.5)])
def test_timeout_in_milliseconds_is_converted_with_one_warning(logs, raw, expected):
    settings = load_settings(environ={"OTEL_EXPORTER_OTLP_TIMEOUT": raw})
    assert settings.otlp_timeout_s == expected
    (message,) = messages(logs)
    assert "milliseconds" in message
    assert "OTEL_EXPORTER_OTLP_TIMEOUT" in message


@pytest.mark.parametrize("raw", ["abc", "-1", "0", "nan", "inf", "10s"])
def test_malformed_timeout_uses_ten_seconds_with_a_warning(logs, raw):
    assert load_settings(environ={"OTEL_EXPORTER_OTLP_TIMEOUT": raw}).otlp_timeout_s == 10.0
    (message,) = messages(logs)
    assert "OTEL_EXPORTER_OTLP_TIMEOUT" in message


def test_metrics_timeout_beats_the_general_one(logs):
    settings = load_settings(
        environ={"OTEL_EXPORTER_OTLP_TIMEOUT": "7", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "3"}
    )
    assert settings.otlp_timeout_s == 3.0
    assert warnings(logs) == []


def test_malformed_metrics_timeout_names_its_own_variable(logs):
    settings = load_settings(
        environ={"OTEL_EXPORTER_OTLP_TIMEOUT": "7", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "x"}
    )
    assert settings.otlp_timeout_s == 10.0
    (message,) = messages(logs)
    assert "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT" in message


# ------------------------------------------------------------------------------ insecure


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"OTEL_EXPORTER_OTLP_INSECURE": "true"}, True),
        ({"OTEL_EXPORTER_OTLP_INSECURE": "false"}, False),
        (
            {"OTEL_EXPORTER_OTLP_INSECURE": "false", "OTEL_EXPORTER_OTLP_METRICS_INSECURE": "1"},
            True,
        ),
        (
            {"OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_METRICS_INSECURE": "no"},
            False,
        ),
        # blank means unset, as for every other variable: the endpoint's scheme decides
        ({"OTEL_EXPORTER_OTLP_INSECURE": ""}, None),
        ({"OTEL_EXPORTER_OTLP_METRICS_INSECURE": " "}, None),
        (
            {"OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_METRICS_INSECURE": ""},
            True,
        ),
    ],
)
def test_insecure(environ, expected):
    assert load_settings(environ=environ).otlp_insecure is expected


# ------------------------------------------------------------------- resource attributes


def test_resource_attributes_parsing(logs):
    settings = load_settings(
        environ={
            "OTEL_RESOURCE_ATTRIBUTES": (
                "deployment.environment=prod, team=rl%20core,service.name=trainer,k=a%3Db"
            )
        }
    )
    assert resource(settings) == {
        "deployment.environment": "prod",
        "team": "rl core",
        "service.name": "trainer",
        "k": "a=b",
    }
    assert warnings(logs) == []


def test_malformed_resource_attribute_pair_is_skipped_with_a_warning(logs):
    settings = load_settings(environ={"OTEL_RESOURCE_ATTRIBUTES": "a=1,novalue,=x,b=2"})
    assert resource(settings) == {"a": "1", "b": "2"}
    (message,) = messages(logs)
    assert "OTEL_RESOURCE_ATTRIBUTES" in message


def test_service_name_wins_over_resource_attributes():
    settings = load_settings(
        environ={
            "OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs,team=rl",
            "OTEL_SERVICE_NAME": "from-service-name",
        }
    )
    assert resource(settings) == {"service.name": "from-service-name", "team": "rl"}


def test_service_name_alone():
    assert resource(load_settings(environ={"OTEL_SERVICE_NAME": "grpo"})) == {
        "service.name": "grpo"
    }


def test_rank_variables_become_int_attributes():
    settings = load_settings(environ={"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"})
    attributes = resource(settings)
    assert attributes["rl.rank"] == 3
    assert attributes["rl.local_rank"] == 1
    assert attributes["rl.world_size"] == 8
    assert (attributes["dl.rank"], attributes["dl.world_size"]) == (3, 8)  # NeMo-Lens's names
    for name in ("rl.rank", "rl.local_rank", "rl.world_size", "dl.rank", "dl.world_size"):
        assert type(attributes[name]) is int
    ids = identity(settings)
    assert ids["nemo.run.id"] == ids["rl.run.id"]
    assert ids["host.name"] == socket.gethostname()
    assert ids["service.instance.id"] == f"{ids['rl.run.id']}/rank-3"


def test_service_name_defaults_to_the_script_or_package(monkeypatch):
    for argv0, expected in [
        ("examples/run_grpo_math.py", "run_grpo_math"),
        ("/venv/lib/python3.13/site-packages/torch/distributed/run.py", "run"),
        ("/x/site-packages/nemo_rl/__main__.py", "nemo_rl"),
        ("-c", "unknown_service"),
        ("", "unknown_service"),
    ]:
        monkeypatch.setattr("sys.argv", [argv0])
        assert dict(load_settings(environ={}).resource_attributes)["service.name"] == expected
    monkeypatch.setattr("sys.argv", [])
    assert config.default_service_name() == "unknown_service"


def test_node_rank_prefers_group_rank():
    attributes = resource(load_settings(environ={"GROUP_RANK": "2", "NODE_RANK": "5"}))
    assert attributes == {"rl.node_rank": 2}
    assert resource(load_settings(environ={"NODE_RANK": "5"})) == {"rl.node_rank": 5}


def test_a_given_host_name_and_instance_id_are_kept():
    attributes = identity(load_settings(environ={"OTEL_RESOURCE_ATTRIBUTES": "host.name=node7"}))
    assert attributes["host.name"] == "node7"
    assert attributes["service.instance.id"].startswith(f"{attributes['rl.run.id']}/node7/pid-")
    attributes = identity(
        load_settings(environ={"RANK": "0", "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=mine"})
    )
    assert attributes["service.instance.id"] == "mine"


@pytest.mark.parametrize("raw", ["x", "-1", "1.5", ""])
def test_non_integer_rank_is_ignored(raw):
    attributes = resource(load_settings(environ={"RANK": raw, "WORLD_SIZE": "4"}))
    assert attributes == {"rl.world_size": 4, "dl.world_size": 4}
    settings = load_settings(environ={"RANK": raw, "WORLD_SIZE": "4"})
    assert "/rank-" not in identity(settings)["service.instance.id"]


@pytest.mark.parametrize("raw", ["0", "false", "off"])
def test_rank_attributes_can_be_turned_off(raw):
    settings = load_settings(
        environ={
            "RANK": "3",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "8",
            "ASYNC_TEE_RANK_ATTRIBUTES": raw,
            "OTEL_SERVICE_NAME": "svc",
        }
    )
    assert resource(settings) == {"service.name": "svc"}


def test_load_settings_never_raises_on_garbage(logs):
    garbage = {
        name: "\x00\u2603=,,==%zz"
        for name in (
            "ASYNC_TEE_ENABLED",
            "ASYNC_TEE_QUEUE_SIZE",
            "ASYNC_TEE_DRAIN_INTERVAL",
            "ASYNC_TEE_SHUTDOWN_TIMEOUT",
            "ASYNC_TEE_MAX_ATTRIBUTE_SETS",
            "ASYNC_TEE_RANK_ATTRIBUTES",
            "ASYNC_TEE_FLUSH_SIGNALS",
            "ASYNC_TEE_STEP_EXPORT",
            "ASYNC_TEE_MIN_EXPORT_INTERVAL",
            "ASYNC_TEE_HELD_TTL",
            "ASYNC_TEE_RUN_ID",
            "OTEL_SDK_DISABLED",
            "OTEL_METRICS_EXPORTER",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "OTEL_EXPORTER_OTLP_INSECURE",
            "OTEL_METRIC_EXPORT_INTERVAL",
            "OTEL_METRIC_EXPORT_TIMEOUT",
            "OTEL_RESOURCE_ATTRIBUTES",
            "OTEL_EXPORTER_PROMETHEUS_PORT",
            "RANK",
        )
    }
    settings = load_settings(environ=garbage)
    assert settings.queue_size == 1024
    assert settings.exporters == ("otlp",)
    assert settings.otlp_headers == ()
    assert settings.otlp_timeout_s == 10.0
    assert warnings(logs)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, ("TERM",)),
        ("TERM,USR1", ("TERM", "USR1")),
        (" sigterm , SIGUSR1,term", ("TERM", "USR1")),
        ("", ()),
    ],
)
def test_flush_signals(raw, expected, logs):
    environ = {} if raw is None else {"ASYNC_TEE_FLUSH_SIGNALS": raw}
    assert load_settings(environ=environ).flush_signals == expected
    assert warnings(logs) == []


@pytest.mark.parametrize("raw", ["KILL", "TERM,BOGUS", "STOP"])
def test_signals_that_cannot_be_flushed_on_are_refused_with_one_warning(raw, logs):
    assert load_settings(environ={"ASYNC_TEE_FLUSH_SIGNALS": raw}).flush_signals == ("TERM",)
    assert len(warnings(logs)) == 1
