"""Tools: the protocol every tool follows, the built-in tools and the registry that builds them by name."""
