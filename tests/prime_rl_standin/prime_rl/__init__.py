"""A stand-in of prime-rl's reporting (see the README beside this package)."""
