"""The one error a registry caller is meant to read."""


class RegistryError(Exception):
    """A request the registry refuses; its message goes back to the caller as ``Reply.error``."""
