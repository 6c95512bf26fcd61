"""Programs that run on every rank, started by the tarantella launcher."""
