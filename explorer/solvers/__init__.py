"""Solvers chosen by name (see `make_solver`)."""
