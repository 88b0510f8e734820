"""The simulated vLLM fleet and the demo that plays an incident on it: for trying the sidecar and for tests.
The sidecar never imports it."""
