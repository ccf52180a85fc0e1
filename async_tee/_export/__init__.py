"""The exports: the exporting reader, the exporters, the provider, OTLP encoding and transport."""
