"""Recipes: scripts that build artefacts the library ships (not part of the installed package)."""
