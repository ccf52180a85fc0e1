"""The exports: OTLP's request, backlog, sender and transports; the SDK's readers; the provider."""
