"""Planning host changes: a list of actions computed from discovery, shown before applied."""
