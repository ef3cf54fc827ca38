"""The JIT runtime: signatures, dispatcher, policy, compile pool, metrics, shape logs."""
