"""memflow widgets."""
