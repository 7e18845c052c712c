"""Renderers: text (human), JSON, Prometheus textfile, JUnit XML. All take a Report, none judge."""
