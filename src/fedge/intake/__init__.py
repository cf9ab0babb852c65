"""A config on its way in, before torch loads: where it comes from, the catalog, the checks."""
