"""Model definitions written against the backend op interface."""
