"""Runtime shared by the prefill and decode workers: the engine loop and registration."""
