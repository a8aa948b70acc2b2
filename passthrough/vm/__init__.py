"""Guests: spec, domain XML, validation, libvirt."""
