"""Declaring: rows, the derived and self series, the shipped rows, Prometheus names."""
