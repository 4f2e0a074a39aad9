"""``minfer serve``: OpenAI-compatible HTTP server (app: routes, protocol: request/response models,
runner: engine thread, metrics: Prometheus, lifecycle: uvicorn with a draining shutdown)."""
