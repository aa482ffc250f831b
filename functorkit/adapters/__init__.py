"""Backend adapters, each loaded lazily the first time one of its objects is met."""
