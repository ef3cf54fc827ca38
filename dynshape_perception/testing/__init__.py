"""The harness that starts nodes and probes topics, for the demo and the integration tests."""
