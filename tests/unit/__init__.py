"""Unit tests: no cluster, no model; helper modules (api_support, ...) import as tests.unit.*."""
