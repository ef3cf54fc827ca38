"""Tools apart from the runtime a vehicle runs: bench, fit, eval, verify, bundle, replay, sim."""
