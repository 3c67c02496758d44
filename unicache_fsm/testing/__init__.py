"""The public fuzzing kit (see the submodules)."""
