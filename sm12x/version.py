"""sm12x's release number (a leaf module: the runtime guard keys its verdicts on it and the CLI
prints it, without importing the package's start-up code)."""
__version__ = "0.1.0"
