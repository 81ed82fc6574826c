"""The persistence boundary: the only package of the provider that imports ``lance``."""
